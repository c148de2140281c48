"""Sampled runs in a real DuckDB file: samples and per-call tests written through `RowBuffer` as a sampled
replay writes them, read back by `summary` and gated by `check`. The BH verdicts computed in Python agree with
the `sampled_call_shifts` view; the planted shift is found where it was planted and nowhere else."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from click.testing import CliRunner

from toolaudit.analysis.sampled import sampled_gate, sampled_summary
from toolaudit.cli import cli
from toolaudit.compare import distributions as dist
from toolaudit.store import RowBuffer, Store
from toolaudit.store import sampled_queries as sq

N = 16
SEARCH = "search_tickets"
CLOSE = "close_ticket"


def _sig(tool: str, args: dict) -> str:
    return f"{tool}({json.dumps(args, sort_keys=True, separators=(',', ':'))})"


# outcome -> (kind, tool, arguments)
OUTCOMES = {
    "s5": ("tool_call", SEARCH, {"query": "q", "limit": 5}),
    "s10": ("tool_call", SEARCH, {"query": "q", "limit": 10}),
    "s50": ("tool_call", SEARCH, {"query": "q", "limit": 50}),
    "bad": ("schema_invalid", SEARCH, {"query": "q", "limit": "many"}),
    "c1": ("tool_call", CLOSE, {"ticket_id": 1}),
    "c2": ("tool_call", CLOSE, {"ticket_id": 2}),
    "none": ("no_tool_call", None, None),
    "truncated": ("truncated", None, None),
    "error": ("error", None, None),
}
BASE = {SEARCH: {"s5": 0.6, "s10": 0.3, "none": 0.1}, CLOSE: {"c1": 0.7, "c2": 0.2, "none": 0.1}}
SHIFTED = {"s5": 0.25, "s10": 0.05, "s50": 0.5, "bad": 0.2}  # TV 0.75 from BASE[SEARCH]


def _outcome(key: str) -> tuple[str, str, str | None, str | None]:
    kind, tool, args = OUTCOMES[key]
    outcome = _sig(tool, args) if kind == "tool_call" else kind
    return outcome, kind, tool, None if args is None else json.dumps(args)


def _write_sampled_run(store: Store, rng: np.random.Generator) -> tuple[int, dict]:
    """60 calls in 12 sessions of 5 (acme: sessions 0-5, globex: 6-11); even calls search, odd calls close. The
    candidate shifts globex's search calls (18); one call's candidate is all but one truncated (untested); a few
    failed samples elsewhere. Returns the run id and what was planted."""
    run_id = store.create_run("replay", "sampled", "target", "spec-ngram", "traces.jsonl", "traces.jsonl",
                              {"samples": N, "temperature": 0.7})
    buf = RowBuffer()
    planted, left_out = set(), Counter()
    for s in range(12):
        session, customer = f"s{s:02d}", "acme" if s < 6 else "globex"
        for i in range(5):
            tool = SEARCH if i % 2 == 0 else CLOSE
            probs = BASE[tool]
            cand = SHIFTED if customer == "globex" and tool == SEARCH else probs
            if cand is SHIFTED:
                planted.add((session, i))
            sides = {side: list(rng.choice(list(p), size=N, p=list(p.values())))
                     for side, p in (("baseline", probs), ("candidate", cand))}
            if (s, i) == (0, 1):
                sides["candidate"] = ["c1"] + ["truncated"] * (N - 1)
            if i == 3 and s % 4 == 0:
                sides["baseline"][5] = "error"
            outcomes = {}
            for side, keys in sides.items():
                outcomes[side] = []
                for j, key in enumerate(keys):
                    outcome, kind, name, args = _outcome(key)
                    buf.add("samples", run_id=run_id, session_id=session, call_index=i, side=side, sample_index=j,
                            path_name=side, outcome=outcome, outcome_kind=kind, tool_name=name, arguments=args,
                            completion_tokens=12, finish_reason="length" if kind == "truncated" else "stop")
                    outcomes[side].append(outcome)
                    if kind in dist.UNTESTED:
                        left_out[(side, kind)] += 1
            b, c = dist.tested(outcomes["baseline"]), dist.tested(outcomes["candidate"])
            t = dist.call_test(b, c, seed=s * 5 + i)
            top = Counter(_outcome(k)[2] for k in sides["baseline"]).most_common(1)[0][0]
            buf.add("sampled_calls", run_id=run_id, session_id=session, call_index=i, customer=customer,
                    tool_name=top, **t.as_row())
            sample_zero_call(buf, run_id, session, i, customer, tool,
                             outcomes["baseline"][0] != outcomes["candidate"][0])
    for chunk, (drafted, accepted) in enumerate(((1200, 30), (800, 10))):  # 2% of the proposals accepted
        buf.add("replay_chunks", run_id=run_id, chunk_no=chunk, side="baseline", path_name="target", calls=30,
                wall_s=1.0, completion_tokens=9000, drafted_tokens=0, accepted_tokens=0, forward_passes=9000,
                errors=0)
        buf.add("replay_chunks", run_id=run_id, chunk_no=chunk, side="candidate", path_name="spec-ngram", calls=30,
                wall_s=1.0, completion_tokens=9000, drafted_tokens=drafted, accepted_tokens=accepted,
                forward_passes=8000, errors=0)
    store.write_rows(buf)
    store.finish_run(run_id, {})
    return run_id, {"shifted": planted, "left_out": left_out}


def sample_zero_call(buf: RowBuffer, run_id: int, session: str, index: int, customer: str, tool: str,
                     drifted: bool) -> None:
    """A sampled call's `calls` row: sample 0's pair, as a replay writes it."""
    buf.add("calls", run_id=run_id, session_id=session, call_index=index, customer=customer, tool_name=tool,
            match_status="matched", drift_kind="arguments_changed" if drifted else "identical",
            drifted=drifted, exact_text_match=not drifted, baseline_valid=True, candidate_valid=True,
            arg_diff_count=int(drifted))


def _write_plain_run(store: Store) -> int:
    run_id = store.create_run("replay", "greedy", "target", "spec-ngram", "t.jsonl", "t.jsonl", {})
    buf = RowBuffer()
    for i in range(10):
        buf.add("calls", run_id=run_id, session_id="g", call_index=i, customer="acme", tool_name=SEARCH,
                match_status="matched", drift_kind="identical", drifted=False, exact_text_match=True,
                baseline_valid=True, candidate_valid=True, arg_diff_count=0)
    store.write_rows(buf)
    store.finish_run(run_id, {})
    return run_id


def _write_p_values(store: Store, p_values: list[float | None]) -> int:
    """A run whose per-call tests are given p-values (ties, ones, NULLs): the view's BH against scipy's."""
    run_id = store.create_run("replay", "pvalues", "a", "b", "t", "t", {"samples": 4})
    buf = RowBuffer()
    for i, p in enumerate(p_values):
        buf.add("sampled_calls", run_id=run_id, session_id=f"s{i % 7}", call_index=i, n_baseline=4, n_candidate=4,
                outcomes=2, p_value=p)
    store.write_rows(buf)
    store.finish_run(run_id, {})
    return run_id


def _write_cut_run(store: Store) -> int:
    """A sampled run whose sample 0 was cut at max_tokens on every call (no matched `calls` row) while the other
    samples answered: the distribution tests exist, the greedy figures do not."""
    run_id = store.create_run("replay", "cut", "target", "spec-ngram", "t.jsonl", "t.jsonl", {"samples": 4})
    buf = RowBuffer()
    for i in range(6):
        sides = {"baseline": ["truncated", "s5", "s5", "s10"], "candidate": ["truncated", "s5", "s10", "s10"]}
        for side, keys in sides.items():
            for j, key in enumerate(keys):
                outcome, kind, name, args = _outcome(key)
                buf.add("samples", run_id=run_id, session_id="c", call_index=i, side=side, sample_index=j,
                        outcome=outcome, outcome_kind=kind, tool_name=name, arguments=args)
        t = dist.call_test(*(dist.tested(_outcome(k)[0] for k in sides[side]) for side in sides), seed=i)
        buf.add("sampled_calls", run_id=run_id, session_id="c", call_index=i, customer="acme", tool_name=SEARCH,
                **t.as_row())
        buf.add("calls", run_id=run_id, session_id="c", call_index=i, customer="acme", match_status="truncated")
    store.write_rows(buf)
    store.finish_run(run_id, {})
    return run_id


@pytest.fixture(scope="module")
def sampled_db(tmp_path_factory):
    db = tmp_path_factory.mktemp("sampled") / "sampled.duckdb"
    rng = np.random.default_rng(34)
    with Store(db) as store:
        run_id, planted = _write_sampled_run(store, rng)
        plain = _write_plain_run(store)
        p = [float(x) for x in np.round(rng.uniform(0, 0.2, 150) ** 2, 3)] + [1.0] * 30 + [None] * 10 + [0.004] * 5
        pvalues = _write_p_values(store, p)
        cut = _write_cut_run(store)
    return {"db": str(db), "run": run_id, "plain": plain, "pvalues": pvalues, "cut": cut, **planted}


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_bh_in_python_agrees_with_the_view(sampled_db):
    with Store(sampled_db["db"], read_only=True) as store:
        for run_id in (sampled_db["run"], sampled_db["pvalues"]):
            rows = sq.sampled_call_rows(store, run_id)
            view = {(r["session_id"], r["call_index"]): r for r in sq.view_shifts(store, run_id)}
            q = dist.bh_q_values([r["p_value"] for r in rows])
            flags = dist.shifted([r["p_value"] for r in rows])
            assert len(view) == sum(r["p_value"] is not None for r in rows)
            for row, qv, flag in zip(rows, q, flags):
                v = view.get((row["session_id"], row["call_index"]))
                assert (v is None) == (qv is None)
                if v is not None:
                    assert v["q_value"] == pytest.approx(qv, rel=1e-9) and v["shifted"] == flag
            assert sum(flags) == sum(v["shifted"] for v in view.values())
        assert sampled_summary(store, sampled_db["run"])["shifted_calls"] == sum(
            v["shifted"] for v in sq.view_shifts(store, sampled_db["run"]))


def test_summary_json_of_a_sampled_run(sampled_db):
    out = invoke("summary", "--db", sampled_db["db"], "--run", str(sampled_db["run"]), "--as", "json")
    assert out.exit_code == 0, out.output
    s = json.loads(out.output)
    assert s["samples_per_call"] == N and s["shifted_calls"] == s["sampled"]["shifted_calls"]
    x = s["sampled"]
    with Store(sampled_db["db"], read_only=True) as store:
        flagged = {(r["session_id"], r["call_index"]) for r in sq.view_shifts(store, sampled_db["run"])
                   if r["shifted"]}
    assert len(flagged & sampled_db["shifted"]) >= 15 and len(flagged - sampled_db["shifted"]) <= 1
    assert s["global_p"] < 0.001 and x["global_calls"] == 59
    assert (x["calls"], x["calls_tested"], x["calls_untested"]) == (60, 59, 1)
    expected: dict = {}
    for (side, kind), n in sampled_db["left_out"].items():
        expected.setdefault(side, {})[kind] = n
    assert x["samples_left_out"] == expected and expected["candidate"]["truncated"] == N - 1
    customers = {c["customer"]: c for c in x["customers"]}
    assert customers["globex"]["global_p"] < 0.001 and customers["acme"]["global_p"] > 0.01
    assert customers["acme"]["shifted_calls"] <= 1
    valid = x["paired"]["schema_valid_rate"]
    assert valid["calls"] == 60 and valid["high"] < 0 < valid["baseline"] - valid["candidate"]
    assert x["power"]["per_call_tv"] == pytest.approx(dist.power(N, 59).per_call_tv)
    limit = [a for a in x["argument_values"] if a["argument"] == "limit" and a["value"] == "50"]
    assert limit and limit[0]["difference"] > 0.3 and limit[0]["calls"] == 18
    worst = x["most_shifted"][0]
    assert (worst["session_id"], worst["call_index"]) in sampled_db["shifted"]
    assert sum(h["samples"] for h in worst["baseline"]) == worst["n_baseline"]
    tools = {t["tool_name"]: t for t in x["tool_choice"]}
    assert set(tools) == {SEARCH, CLOSE} and abs(tools[CLOSE]["difference"]) < 0.1
    assert x["candidate_acceptance"] == {"drafted": 2000, "accepted": 40, "rate": 0.02, "low": True}
    with Store(sampled_db["db"], read_only=True) as store:  # nothing proposed (no timings): no figure, no line
        assert sampled_summary(store, sampled_db["cut"])["candidate_acceptance"] is None


def test_summary_text_of_a_sampled_run(sampled_db):
    out = invoke("summary", "--db", sampled_db["db"], "--run", str(sampled_db["run"]))
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("sampled run:"))
    head, counts = lines[at], lines[at + 1]
    assert head.startswith("sampled run: shifted: ") and "drift" not in head  # the finding in words first
    assert counts.startswith(f"  {N} samples per call; ")
    assert "calls shifted (distribution_shift, BH q=0.05); global p = " in counts
    for text in ("power (80%", "schema-valid rate", "most-shifted call: ", "distribution_shift, TV"):
        assert text in out.output
    reach = next(line for line in out.output.splitlines() if "proposals accepted" in line)
    assert "2.00% (40 of 2000 drafted tokens" in reach and "says little about the sampler" in reach
    # one screen: a few rows per table, the rest behind the command that shows them all
    assert len(lines) <= 36, out.output
    every = f"toolaudit summary --run {sampled_db['run']} --all --db {sampled_db['db']}"
    assert f"more slices: {every}" in out.output or "slices: " in out.output
    full = invoke("summary", "--db", sampled_db["db"], "--run", str(sampled_db["run"]), "--all")
    assert full.exit_code == 0, full.output
    for text in ("most-shifted calls (lowest p)", "FROM sampled_call_shifts", "global test", "median TV distance"):
        assert text in full.output
    assert len(full.output.splitlines()) > len(lines)
    plain = invoke("summary", "--db", sampled_db["db"], "--run", str(sampled_db["plain"]), "--as", "json")
    assert json.loads(plain.output)["samples_per_call"] == 1 and json.loads(plain.output)["sampled"] is None


def test_check_gates_a_sampled_run(sampled_db):
    db, run = sampled_db["db"], str(sampled_db["run"])
    with Store(db, read_only=True) as store:
        gate = sampled_gate(store, sampled_db["run"])
    tight = invoke("check", "--db", db, "--run", run, "--max-shifted-calls", "10%")
    assert tight.exit_code == 1 and "shifted calls upper bound" in tight.output
    assert "(distribution_shift, BH q=0.05)" in tight.output
    loose = invoke("check", "--db", db, "--run", run, "--max-shifted-calls", f"{100 * gate.shifted.high + 1:.1f}%")
    assert loose.exit_code == 0, loose.output
    assert loose.output.startswith(f"ok: run {run}: sampled, {N} samples per call (sample 0 differs in ")
    noise = invoke("check", "--db", db, "--run", run, "--max-call-drift", "100%")
    assert noise.exit_code == 0 and "its call drift compares sample 0 with sample 0" in noise.output
    between = f"{100 * (gate.shifted.p + gate.shifted.high) / 2:.2f}%"  # over the point, under the upper bound
    assert invoke("check", "--db", db, "--run", run, "--max-shifted-calls", between).exit_code == 1
    assert invoke("check", "--db", db, "--run", run, "--max-shifted-calls", between, "--rule", "point").exit_code == 0

    drop, low, high = gate.valid_drop
    assert low < drop < high and drop > 0
    out = invoke("check", "--db", db, "--run", run, "--max-valid-drop", f"{100 * drop:.2f}pp", "--json")
    assert out.exit_code == 1, out.output
    verdict = json.loads(out.output)
    check = next(c for c in verdict["runs"][0]["checks"] if c["name"] == "valid_drop")
    assert check["figure"] == pytest.approx(high) and check["ok"] is False and check["calls"] == 60
    ok = invoke("check", "--db", db, "--run", run, "--max-valid-drop", f"{100 * high + 0.1:.2f}pp",
                "--max-shifted-calls", "90%", "--json")
    assert ok.exit_code == 0, ok.output
    names = [c["name"] for c in json.loads(ok.output)["runs"][0]["checks"]]
    assert names[:2] == ["shifted_calls", "valid_drop"]


def test_sampled_bounds_on_a_run_that_is_not_sampled_are_a_usage_error(sampled_db):
    out = invoke("check", "--db", sampled_db["db"], "--run", str(sampled_db["plain"]), "--max-shifted-calls", "5%")
    assert out.exit_code == 2 and "--max-shifted-calls: run 2 is not a sampled run" in out.output
    out = invoke("check", "--db", sampled_db["db"], "--run", str(sampled_db["plain"]), "--max-valid-drop", "1pp")
    assert out.exit_code == 2 and "--max-valid-drop" in out.output


def test_sampled_bounds_need_no_matched_sample_0(sampled_db):
    """Sample 0 cut everywhere: the sampled bounds still judge the tests; a greedy bound has nothing to judge."""
    db, run = sampled_db["db"], str(sampled_db["cut"])
    ok = invoke("check", "--db", db, "--run", run, "--max-shifted-calls", "100%", "--max-valid-drop", "100pp")
    assert ok.exit_code == 0 and "0 of 6 calls tested shifted" in ok.output, ok.output
    greedy = invoke("check", "--db", db, "--run", run, "--max-shifted-calls", "100%", "--max-call-drift", "5%")
    assert greedy.exit_code == 2 and "has no matched calls" in greedy.output


def test_a_sampled_slice_says_what_its_evidence_allows():
    """The finding in words: a shift where a test rejects; no shift only where one call's test would see TV 0.5;
    else inconclusive, with the samples per call a decision needs (N = 8 a side sees only TV >= 0.70)."""
    from toolaudit.analysis.sampled import INCONCLUSIVE, NO_SHIFT, SHIFTED, verdict

    eight = verdict(8, 4, 0, 0.723)
    assert eight["state"] == INCONCLUSIVE and eight["text"].startswith("inconclusive: 8 samples per call cannot tell")
    assert eight["detectable_tv"] == pytest.approx(0.70, abs=0.01) and eight["samples_needed"] > 8
    assert f"N = {eight['samples_needed']} per call" in eight["text"]
    enough = verdict(eight["samples_needed"], 4, 0, 0.5)
    assert enough["state"] == NO_SHIFT and "can detect TV >= 0.50" in enough["text"]
    assert verdict(8, 4, 1, 0.5)["state"] == SHIFTED and verdict(8, 4, 0, 0.01)["state"] == SHIFTED
    assert verdict(64, 0, 0, None)["state"] == INCONCLUSIVE  # nothing tested: nothing shown


def test_a_sampled_runs_speed_counts_every_sample_in_every_view(tmp_path):
    """tokens/s, acceptance and tokens per pass of a sampled run are every sample's over the calls' shares of the
    engine's time: the frontier views (`summary`, reports, `history`) equal the engine's own accounting
    (`path_performance`), where they once read sample 0's tokens over every sample's time (16x too slow). A run
    written before the shares and counters were stored (NULLs) still reads as it did: sample 0's counters."""
    from toolaudit.analysis.speed import speed
    from toolaudit.store.queries import path_rows

    with Store(tmp_path / "speed.duckdb") as store:
        runs = []
        for legacy in (False, True):
            run_id = store.create_run("replay", f"sampled-{legacy}", "target", "spec-ngram", "t.jsonl", "t.jsonl",
                                      {"samples": 4, "temperature": 0.7})
            buf = RowBuffer()
            for side, path, share in (("baseline", "target", 2.0), ("candidate", "spec-ngram", 1.0)):
                tokens = drafted = accepted = passes = 0
                for call in range(3):
                    per_sample = [(10 + call + i, 5 * i, 2 * i, 10 - i) for i in range(4)]  # tokens, drafted, ...
                    if side == "baseline":
                        per_sample = [(t, 0, 0, t) for t, *_ in per_sample]
                    first = per_sample[0]
                    for i, (t, d, a, f) in enumerate(per_sample):
                        counters = ({} if legacy else
                                    {"drafted_tokens": d, "accepted_tokens": a, "forward_passes": f})
                        buf.add("samples", run_id=run_id, session_id="s", call_index=call, side=side,
                                sample_index=i, path_name=path, outcome="x", outcome_kind="tool_call",
                                completion_tokens=t, **counters)
                    buf.add("outputs", run_id=run_id, session_id="s", call_index=call, side=side, path_name=path,
                            completion_tokens=first[0], tokens_per_s=first[0] / share,
                            wall_share_s=None if legacy else share, drafted_tokens=first[1],
                            accepted_tokens=first[2], forward_passes=first[3])
                    tokens += sum(s[0] for s in per_sample)
                    drafted += sum(s[1] for s in per_sample)
                    accepted += sum(s[2] for s in per_sample)
                    passes += sum(s[3] for s in per_sample)
                buf.add("replay_chunks", run_id=run_id, chunk_no=0, side=side, path_name=path, calls=3,
                        wall_s=3 * share, completion_tokens=tokens, drafted_tokens=drafted, accepted_tokens=accepted,
                        forward_passes=passes, errors=0)
            for call in range(3):
                sample_zero_call(buf, run_id, "s", call, "acme", SEARCH, False)
            store.write_rows(buf)
            store.finish_run(run_id, {})
            runs.append(run_id)
        new, legacy = (speed(store, r) for r in runs)
        engine = {r["side"]: r for r in path_rows(store, runs[0])}
        assert new.baseline_tokens_per_s == pytest.approx(engine["baseline"]["tokens_per_s"])
        assert new.candidate_tokens_per_s == pytest.approx(engine["candidate"]["tokens_per_s"])
        assert new.acceptance_rate == pytest.approx(engine["candidate"]["acceptance_rate"])
        assert new.tokens_per_forward_pass == pytest.approx(engine["candidate"]["tokens_per_forward_pass"])
        # the legacy run: every sample's tokens over the shares implied by sample 0, sample 0's counters
        assert legacy.candidate_tokens_per_s == pytest.approx(new.candidate_tokens_per_s)
        assert legacy.acceptance_rate is None  # sample 0 drafted nothing (5 * 0)
        assert legacy.tokens_per_forward_pass == pytest.approx((10 + 11 + 12) / 30)
