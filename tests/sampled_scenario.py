"""Sampled runs in a real DuckDB file for the report and frontier tests, written through `RowBuffer` as a sampled
replay writes them (the pattern of tests/analysis/test_sampled.py, whose outcome signatures it reuses): each customer's
outcomes carry its own word, so a word in another customer's report is a leak.

`write_sampled_run`: one candidate against the baseline, N samples per call; the candidate's outcome distribution
moves on the customers in `shift`. `write_sampled_matrix`: a remedy matrix of such candidates, each with its speed,
and the noise floor (the baseline with other seeds)."""

from __future__ import annotations

import json

import numpy as np
from analysis.test_sampled import _sig, sample_zero_call

from toolaudit.compare import distributions as dist
from toolaudit.store import RowBuffer, Store

N = 16
TOOL = "search_tickets"
WORDS = {"Zephyr Logistics": "zephyr", "Quokka Mutual": "quokka"}
SESSIONS, CALLS = 4, 3  # per customer
LONG = 1  # the limit whose outcome is a long signature (a label the chart clips)
BASE = {5: 0.6, 10: 0.3, None: 0.1}  # limit -> probability; None: no tool call
SHIFTED = {5: 0.1, 50: 0.4, LONG: 0.2, None: 0.3}  # TV 0.7 from BASE, a third fewer valid calls


def outcome(customer: str, limit: int | None) -> tuple[str, str, str | None, str | None]:
    """(outcome, kind, tool, arguments) of one sample: the customer's word is in every tool call's arguments."""
    if limit is None:
        return "no_tool_call", "no_tool_call", None, None
    args = {"query": f"{WORDS[customer]}-cargo-manifest", "limit": limit}
    if limit == LONG:
        args["note"] = f"{WORDS[customer]} " + "a very long free-text argument that no label can show " * 2
    return _sig(TOOL, args), "tool_call", TOOL, json.dumps(args)


def _member(store: Store, rng: np.random.Generator, candidate: str, shift: set[str], *, matrix_id: int | None = None,
            speed: float = 2.0, noise_floor: bool = False, name: str | None = None) -> int:
    options = {"samples": N, "temperature": 0.7, "noise_floor": noise_floor,
               "baseline_config": {"temperature": 0.7, "samples": N},
               "candidate_config": {"temperature": 0.7, "samples": N}}
    run_id = store.create_run("replay", name, "target", candidate, "traces.jsonl", "traces.jsonl", options,
                              matrix_id=matrix_id)
    buf = RowBuffer()
    for customer, word in WORDS.items():
        for s in range(SESSIONS):
            session = f"{word}-sess-{s}"
            for i in range(CALLS):
                probs = {"baseline": BASE, "candidate": SHIFTED if customer in shift else BASE}
                sides: dict[str, list] = {}
                for side, p in probs.items():
                    keys = list(p)
                    picks = rng.choice(len(keys), size=N, p=list(p.values()))
                    sides[side] = [outcome(customer, keys[k]) for k in picks]
                for side, samples in sides.items():
                    for j, (out, kind, tool, args) in enumerate(samples):
                        buf.add("samples", run_id=run_id, session_id=session, call_index=i, side=side, sample_index=j,
                                path_name=candidate if side == "candidate" else "target", outcome=out,
                                outcome_kind=kind, tool_name=tool, arguments=args, completion_tokens=12,
                                finish_reason="stop")
                    buf.add("outputs", run_id=run_id, session_id=session, call_index=i, side=side,
                            path_name=candidate if side == "candidate" else "target", text=samples[0][0],
                            completion_tokens=12, tokens_per_s=10.0 * (speed if side == "candidate" else 1.0))
                b, c = ([x[0] for x in sides[side]] for side in ("baseline", "candidate"))
                t = dist.call_test(b, c, seed=s * CALLS + i)
                buf.add("sampled_calls", run_id=run_id, session_id=session, call_index=i, customer=customer,
                        tool_name=TOOL, **t.as_row())
                sample_zero_call(buf, run_id, session, i, customer, TOOL, b[0] != c[0])
    store.write_rows(buf)
    store.finish_run(run_id, {})
    return run_id


def write_sampled_run(store: Store, seed: int = 34, shift: frozenset[str] = frozenset({"Zephyr Logistics"})) -> int:
    return _member(store, np.random.default_rng(seed), "spec-ngram", set(shift), name="sampled")


# candidate -> (customers it shifts, speed over the baseline)
MATRIX = {"spec-ngram": (set(), 1.8), "spec-draft": ({"Zephyr Logistics"}, 2.6), "spec-broken": (set(WORDS), 3.4)}
FLOOR = "target-floor"


def write_sampled_matrix(store: Store, seed: int = 7) -> int:
    rng = np.random.default_rng(seed)
    matrix = store.create_run("matrix", "sampled-matrix", "target", ", ".join([*MATRIX, FLOOR]), "t", "t",
                              {"samples": N, "temperature": 0.7})
    for name, (shift, speed) in MATRIX.items():
        _member(store, rng, name, shift, matrix_id=matrix, speed=speed)
    _member(store, rng, FLOOR, set(), matrix_id=matrix, speed=1.02, noise_floor=True)
    store.finish_run(matrix, {})
    return matrix
