"""A canary's history, stored through the store's API as replays would store it (no model runs): nightly runs of
the path pair target vs spec-ngram, with the config components and probes that explain their jumps, a remedy
matrix with a noise floor, a comparison of two recorded logs, and a night that saw only one customer.

Each run has 400 calls in sessions of two; sessions alternate between the customers acme and globex."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path

from toolaudit.engines.fingerprint import fingerprint
from toolaudit.store import RowBuffer, Store

CALLS = 400
CUSTOMERS = ("acme", "globex")
BASE = {"engine": "torch", "model": "smollm2-135m", "dtype": "bfloat16", "versions": {"torch": "2.5.1"}}
OLD_BASE = {**BASE, "versions": {"torch": "2.4.0"}}
CAND4 = {**BASE, "speculative": {"method": "ngram", "num_speculative_tokens": 4}}
OLD_CAND4 = {**OLD_BASE, "speculative": {"method": "ngram", "num_speculative_tokens": 4}}
CAND8 = {**BASE, "speculative": {"method": "ngram", "num_speculative_tokens": 8}}
PROBE_SET = "ps-" + "a" * 61


def sha(tag: str) -> str:
    return (tag * 64)[:64]


@dataclass
class Night:
    """One run: which calls drift (call numbers 0..CALLS-1; even sessions are acme's), its config, its probes."""

    name: str
    drifted: tuple[int, ...]
    base: dict | None = None  # components; None: an old run that stored only fingerprints
    cand: dict | None = None
    fingerprints: tuple[str, str] | None = None  # when components are not stored
    probes: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # side -> (decisions, numerics)
    customers: tuple[str, ...] = CUSTOMERS
    prefill_charged: bool = True  # False: timed before migration 15 (replay_chunks.reused_prefill_s NULL)


def customer_of(call: int, customers: tuple[str, ...] = CUSTOMERS) -> str:
    return customers[(call // 2) % len(customers)]


def _acme(n: int) -> tuple[int, ...]:
    """The first n calls of acme's sessions."""
    return tuple(c for c in range(CALLS) if customer_of(c) == "acme")[:n]


NIGHTS = [
    Night("nightly", _acme(1), fingerprints=(fingerprint(OLD_BASE), fingerprint(OLD_CAND4)), prefill_charged=False),
    Night("nightly", _acme(1), BASE, CAND4, probes={"candidate": (sha("d1"), sha("n1")),
                                                    "baseline": (sha("b1"), sha("m1"))}),
    Night("nightly", _acme(1) + (3,), BASE, CAND4, probes={"candidate": (sha("d1"), sha("n1")),
                                                           "baseline": (sha("b1"), sha("m1"))}),
    Night("nightly", _acme(3), BASE, CAND4, probes={"candidate": (sha("d1"), sha("n2")),
                                                    "baseline": (sha("b1"), sha("m1"))}),
    Night("nightly", _acme(10) + (3, 7), BASE, CAND8, probes={"candidate": (sha("d2"), sha("n3")),
                                                              "baseline": (sha("b1"), sha("m1"))}),
]


def _add_probe(rows: RowBuffer, probe_id: int, run_id: int, side: str, path: str, components: dict,
               decisions: str, numerics: str | None, when: dt.datetime) -> None:
    rows.add("probes", probe_id=probe_id, created_at=when, run_id=run_id, side=side, path_name=path,
             engine="torch", config_fingerprint=fingerprint(components), probe_set=PROBE_SET, prompts=32, repeats=2,
             decisions=decisions, numerics=numerics, stable=True, jitter_max=None, jitter_median=None, seconds=3.2,
             toolaudit_version="0.9.0", engine_versions='{"torch": "2.5.1"}',
             detail='{"prompts": [{"tokens": [5, 17], "logprobs": [-0.01, -0.2], "margins": [3.1, 0.4]}]}')


def _add_calls(rows: RowBuffer, run_id: int, baseline: str, candidate: str, drifted: tuple[int, ...],
               customers: tuple[str, ...], speed: float = 1.0, drafts: bool = True,
               prefill_charged: bool = True) -> None:
    """Calls, both sides' outputs with timings (acceptance 60%), and one replay chunk per side."""
    for c in range(CALLS):
        session, index = f"{customer_of(c, customers)}-sess-{c // 2:04d}", c % 2
        bad = c in drifted
        rows.add("calls", run_id=run_id, session_id=session, call_index=index, customer=customer_of(c, customers),
                 tool_name="search_tickets", match_status="matched",
                 drift_kind="arguments_changed" if bad else "identical", drifted=bad, exact_text_match=not bad,
                 arg_diff_count=1 if bad else 0)
        for side, path, latency in (("baseline", baseline, 0.5), ("candidate", candidate, 0.5 / speed)):
            draft = drafts and side == "candidate"
            rows.add("outputs", run_id=run_id, session_id=session, call_index=index, side=side, path_name=path,
                     text='{"name": "search_tickets"}', parse_status="ok", completion_tokens=20, latency_s=latency,
                     tokens_per_s=20 / latency, drafted_tokens=10 if draft else None,
                     accepted_tokens=6 if draft else None, finish_reason="tool_calls")
    # a call's latency is its share of the engine call's wall time: the chunk's wall time is their sum
    for no, (side, path, wall) in enumerate((("baseline", baseline, 0.5 * CALLS),
                                             ("candidate", candidate, 0.5 * CALLS / speed))):
        draft = drafts and side == "candidate"
        rows.add("replay_chunks", run_id=run_id, chunk_no=no, side=side, path_name=path, calls=CALLS, wall_s=wall,
                 completion_tokens=20 * CALLS, drafted_tokens=10 * CALLS if draft else None,
                 accepted_tokens=6 * CALLS if draft else None, forward_passes=12 * CALLS, errors=0,
                 reused_prefill_s=0.0 if prefill_charged else None)


def _options(base: dict | None, cand: dict | None, candidate: str, noise_floor: bool = False) -> dict:
    options = {"candidate": candidate, "noise_floor": noise_floor}
    if base is not None:
        options |= {"baseline_fingerprint_components": base, "candidate_fingerprint_components": cand}
    return options


def _replay(store: Store, night: Night, probe_ids: list[int], when: dt.datetime) -> int:
    fps = night.fingerprints or (fingerprint(night.base), fingerprint(night.cand))
    run_id = store.create_run("replay", night.name, "target", "spec-ngram", "torch:smollm2-135m bfloat16 batch 8",
                              "torch:smollm2-135m bfloat16 batch 8 spec ngram", _options(night.base, night.cand,
                                                                                         "spec-ngram"), *fps)
    rows = RowBuffer()
    _add_calls(rows, run_id, "target", "spec-ngram", night.drifted, night.customers, speed=1.6,
               prefill_charged=night.prefill_charged)
    for side, (decisions, numerics) in night.probes.items():
        probe_ids.append(len(probe_ids) + 1)
        path, comps = ("target", night.base) if side == "baseline" else ("spec-ngram", night.cand)
        _add_probe(rows, probe_ids[-1], run_id, side, path, comps, decisions, numerics, when)
    store.write_rows(rows)
    store.finish_run(run_id, {"replay": True})
    _dated(store, run_id, when)
    return run_id


def _dated(store: Store, run_id: int, when: dt.datetime) -> None:
    """The night the run was made (the store stamps the time of writing; the test runs all nights at once)."""
    store.con.execute("UPDATE runs SET created_at = ?, finished_at = ? WHERE run_id = ?",
                      [when, when + dt.timedelta(minutes=20), run_id])


@dataclass
class Ids:
    """Which run id is which."""

    nights: list[int]
    compare: int
    matrix: int
    matrix_candidate: int
    floor: int
    globex_only: int
    draft_pair: int


def build(db: Path) -> Ids:
    start = dt.datetime(2026, 6, 1, 2, 30)
    probe_ids: list[int] = []
    with Store(db) as store:
        nights = [_replay(store, night, probe_ids, start + dt.timedelta(days=i)) for i, night in enumerate(NIGHTS)]
        # two recorded logs compared (no fingerprints, no timings): its own pair
        compare = store.create_run("compare", "shadow", "prod", "canary", "prod.jsonl", "canary.jsonl", {})
        rows = RowBuffer()
        _add_calls(rows, compare, "prod", "canary", _acme(2), CUSTOMERS, drafts=False)
        rows.rows["replay_chunks"].clear()  # a comparison of logs times nothing
        store.write_rows(rows)
        store.finish_run(compare, {})
        _dated(store, compare, start + dt.timedelta(days=5, hours=1))
        # night 6: a remedy matrix, the candidate with the noise floor; the baseline's probe recorded with the matrix
        when = start + dt.timedelta(days=6)
        matrix = store.create_run("matrix", "nightly", "target", "spec-ngram, target-b1", "", "",
                                  {"baseline_fingerprint_components": BASE}, fingerprint(BASE))
        member = store.create_run("replay", None, "target", "spec-ngram", "", "", _options(BASE, CAND8, "spec-ngram"),
                                  fingerprint(BASE), fingerprint(CAND8), matrix)
        floor_comps = {**BASE, "batch_size": 1}
        floor = store.create_run("replay", None, "target", "target-b1", "", "",
                                 _options(BASE, floor_comps, "target-b1", noise_floor=True), fingerprint(BASE),
                                 fingerprint(floor_comps), matrix)
        rows = RowBuffer()
        _add_calls(rows, member, "target", "spec-ngram", _acme(8) + (3,), CUSTOMERS, speed=1.7)
        _add_calls(rows, floor, "target", "target-b1", _acme(5), CUSTOMERS, speed=1.0, drafts=False)
        for side, run_id, path, comps, decisions, numerics in (
                ("baseline", matrix, "target", BASE, sha("b1"), sha("m2")),
                ("candidate", member, "spec-ngram", CAND8, sha("d2"), sha("n3"))):
            probe_ids.append(len(probe_ids) + 1)
            _add_probe(rows, probe_ids[-1], run_id, side, path, comps, decisions, numerics, when)
        store.write_rows(rows)
        for run_id in (member, floor, matrix):
            store.finish_run(run_id, {})
            _dated(store, run_id, when)
        # night 7 saw globex only: same config and probes as night 6
        seven = Night("nightly", (1,), BASE, CAND8, probes={"candidate": (sha("d2"), sha("n3")),
                                                            "baseline": (sha("b1"), sha("m2"))},
                      customers=("globex",))
        globex_only = _replay(store, seven, probe_ids, start + dt.timedelta(days=7))
        # another candidate path, once
        draft = store.create_run("replay", "draft-trial", "target", "spec-draft", "", "",
                                 _options(BASE, {**BASE, "speculative": {"method": "draft"}}, "spec-draft"),
                                 fingerprint(BASE), fingerprint({**BASE, "speculative": {"method": "draft"}}))
        rows = RowBuffer()
        _add_calls(rows, draft, "target", "spec-draft", _acme(4), CUSTOMERS, speed=2.0)
        store.write_rows(rows)
        store.finish_run(draft, {})
        _dated(store, draft, start + dt.timedelta(days=7, hours=3))
    return Ids(nights, compare, matrix, member, floor, globex_only, draft)
