"""Remedy matrices: one baseline decoded once, several candidates diffed against it, on the real torch engine
(tiny random Llamas over SmolLM2's tokenizer), with the frontier, the per-customer recommendation and the gate.

Candidates: `tiny-spec` (n-gram speculation, float32: exact, 0 drift), `tiny-b1` (batch 1) and `echo` (another
model: drifts on most calls), so a budget separates them."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import REPO
from helpers import build_tiny_model, torch_path_toml

from toolaudit.analysis.frontier import BASELINE_CHOICE, Budget, customer_frontiers, frontier
from toolaudit.cli import cli
from toolaudit.engines import make_engine
from toolaudit.replay.replayer import ReplayOptions, replay_traces
from toolaudit.store import Store

DEMO = REPO / "traces" / "demo.jsonl"
CANDIDATES = ["tiny-spec", "tiny-b1", "echo"]
REMEDIES = ["tiny-spec", "echo"]  # tiny-b1 is the baseline at another batch size: the noise floor, not a remedy


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path]:
    return (build_tiny_model(tmp_path_factory.mktemp("tiny")),
            build_tiny_model(tmp_path_factory.mktemp("echo"), echo=True))


# Random weights never end an answer (each would stop at max_tokens: truncated, not compared); these stop strings
# end the tiny model's at its first "e" or newline and the echo model's (which repeats the prefill's newline) at once.
STOP = ("e", "\n")


@pytest.fixture
def paths_file(tmp_path, models) -> Path:
    tiny, echo = models
    text = (torch_path_toml("tiny", tiny, batch_size=4, stop=STOP)
            + torch_path_toml("tiny-spec", tiny, batch_size=4, speculative=True, stop=STOP)
            + torch_path_toml("tiny-b1", tiny, batch_size=1, stop=STOP)
            + torch_path_toml("echo", echo, batch_size=4, stop=STOP))
    path = tmp_path / "paths.toml"
    path.write_text(text)
    return path


def options(paths_file: Path, **kw) -> ReplayOptions:
    kw.setdefault("limit", 12)
    return ReplayOptions(traces=[str(DEMO)], baseline="tiny", candidate=CANDIDATES[0], candidates=CANDIDATES,
                         paths_file=str(paths_file), schema_dir=str(REPO / "schemas"), chunk=4, **kw)


class _Counting:
    """The real engine factory, counting the requests each path decodes (the baseline must decode each call
    once, whatever the number of candidates); `stop_after` raises Ctrl-C on that many engine calls."""

    def __init__(self, stop_after: int | None = None):
        self.requests: Counter = Counter()
        self.calls = 0
        self.stop_after = stop_after

    def __call__(self, path):
        engine = make_engine(path)
        real = engine.generate

        def generate(requests):
            self.calls += 1
            if self.stop_after is not None and self.calls > self.stop_after:
                raise KeyboardInterrupt
            self.requests[path.name] += len(requests)
            return real(requests)

        engine.generate = generate
        return engine


def member_rows(store: Store, matrix: int) -> dict[str, list[tuple]]:
    out = {}
    for m in store.matrix_members(matrix):
        out[m["candidate_name"]] = store.query("""
            SELECT c.session_id, c.call_index, c.match_status, c.drift_kind, b.text, k.text
            FROM calls c JOIN outputs b ON b.run_id = c.run_id AND b.session_id = c.session_id
                 AND b.call_index = c.call_index AND b.side = 'baseline'
            JOIN outputs k ON k.run_id = c.run_id AND k.session_id = c.session_id
                 AND k.call_index = c.call_index AND k.side = 'candidate'
            WHERE c.run_id = ? ORDER BY 1, 2""", [m["run_id"]])[1]
    return out


@pytest.mark.parametrize("path_major", [False, True])
def test_matrix_decodes_the_baseline_once_and_diffs_every_candidate_against_it(tmp_path, paths_file, path_major):
    factory = _Counting()
    with Store(tmp_path / "m.duckdb") as store:
        matrix, counts = replay_traces(store, options(paths_file, path_major=path_major), engine_factory=factory)
        assert counts.replayed == 12 and counts.errors == 0
        assert factory.requests == {"tiny": 12, "tiny-spec": 12, "tiny-b1": 12, "echo": 12}
        run = store.run_row(matrix)
        assert run["kind"] == "matrix" and run["status"] == "complete"
        assert store.run_row(None)["run_id"] == matrix  # "latest run" is the matrix, not its last candidate
        members = store.matrix_members(matrix)
        assert [m["candidate_name"] for m in members] == CANDIDATES
        assert all(m["kind"] == "replay" and m["status"] == "complete" and m["baseline_name"] == "tiny"
                   for m in members)
        rows = member_rows(store, matrix)
        assert all(len(r) == 12 for r in rows.values())
        baseline_texts = {name: [r[4] for r in rs] for name, rs in rows.items()}
        assert baseline_texts["tiny-spec"] == baseline_texts["tiny-b1"] == baseline_texts["echo"]
        assert [r[5] for r in rows["tiny-spec"]] == baseline_texts["tiny-spec"]  # float32 speculation is exact
        assert sum(r[3] not in ("identical", "text_only") for r in rows["echo"]) > 0
        # each candidate run carries the shared baseline's timings: the same baseline wall time in each
        walls = store.query("""SELECT run_id, sum(wall_s), sum(calls) FROM replay_chunks
                               WHERE side = 'baseline' AND run_id IN (SELECT run_id FROM runs WHERE matrix_id = ?)
                               GROUP BY run_id ORDER BY run_id""", [matrix])[1]
        assert len({round(w, 9) for _, w, _ in walls}) == 1 and {n for _, _, n in walls} == {12}
        assert store.query("SELECT count(*) FROM staged_results")[1][0][0] == 0


def test_interrupted_matrix_resumes_without_losing_or_repeating_calls(tmp_path, paths_file):
    with Store(tmp_path / "full.duckdb") as store:
        full_id, _ = replay_traces(store, options(paths_file, path_major=True))
        full = member_rows(store, full_id)
    with Store(tmp_path / "cut.duckdb") as store:
        # 3 baseline chunks, then tiny-spec's 3, then one of tiny-b1's chunks: Ctrl-C in the middle of tiny-b1
        with pytest.raises(KeyboardInterrupt):
            replay_traces(store, options(paths_file, path_major=True), engine_factory=_Counting(stop_after=7))
        assert {r["status"] for r in store.rows("SELECT status FROM runs")} == {"interrupted"}
        assert store.query("SELECT count(*) FROM staged_results")[1][0][0] == 12
        factory = _Counting()
        matrix, counts = replay_traces(store, options(paths_file, path_major=True), resume=2,  # a member's id
                                       engine_factory=factory)
        assert matrix == 1
        assert factory.requests == {"tiny-b1": 8, "echo": 12}  # nothing decoded twice: the baseline is staged
        assert member_rows(store, matrix) == full
        assert store.query("SELECT count(*) FROM staged_results")[1][0][0] == 0
        dupes = store.query("""SELECT count(*) FROM (SELECT run_id, session_id, call_index, side, count(*) n
                               FROM outputs GROUP BY ALL HAVING n > 1)""")[1][0][0]
        assert dupes == 0


def test_frontier_recommends_the_fastest_candidate_within_budget(tmp_path, paths_file):
    with Store(tmp_path / "m.duckdb") as store:
        matrix, _ = replay_traces(store, options(paths_file, limit=24))
        overall = frontier(store, matrix)
        by_name = {r.candidate: r for r in overall.remedies}
        assert list(by_name) == REMEDIES and overall.floor.candidate == "tiny-b1"
        assert by_name["tiny-spec"].rate.k == 0 and by_name["echo"].rate.k > 0
        assert all(r.speedup is not None and r.speedup > 0 for r in overall.remedies)
        # the view's speed is the candidate's tokens over its wall time share against the baseline's
        perf = {m["candidate_name"]: store.rows("SELECT side, tokens_per_s FROM path_performance WHERE run_id = ?",
                                                [m["run_id"]]) for m in store.matrix_members(matrix)}
        for name, sides in perf.items():
            if name not in by_name:
                continue
            s = {p["side"]: p["tokens_per_s"] for p in sides}
            assert by_name[name].speedup == pytest.approx(s["candidate"] / s["baseline"], rel=0.05)
        # Pareto: no candidate is at least as good on both axes and better on one
        for r in overall.remedies:
            dominated = any(o.rate.p <= r.rate.p and o.speedup >= r.speedup and (o.rate.p < r.rate.p or
                            o.speedup > r.speedup) for o in overall.remedies if o is not r)
            dominated |= r.speedup <= 1 and (r.rate.p > 0 or r.speedup < 1)
            assert r.pareto is (not dominated)
        # a tight budget excludes echo; the answer is the fastest exact candidate, or target-only
        tight = frontier(store, matrix, budget=Budget(max_call_drift=0.2))
        exact = [r for r in tight.remedies if r.within_budget]
        assert {r.candidate for r in exact} == {"tiny-spec"} and tight.floor.within_budget is None
        best = max(exact, key=lambda r: r.speedup)
        assert tight.recommendation.choice == (best.candidate if best.speedup > 1 else BASELINE_CHOICE)
        none = frontier(store, matrix, budget=Budget(max_call_drift=0.0))
        assert none.recommendation.choice == BASELINE_CHOICE and "no candidate" in none.recommendation.reason
        # per customer: only that customer's calls
        per = customer_frontiers(store, matrix, Budget(max_session_drift=0.5))
        calls = dict(store.query("""SELECT coalesce(customer, '(none)'), count(*) FROM calls
                                    WHERE run_id = ? AND match_status = 'matched' GROUP BY 1""",
                                 [store.matrix_members(matrix)[0]["run_id"]])[1])
        assert {f.customer: f.remedies[0].rate.n for f in per} == calls
        assert all(f.recommendation is not None for f in per)


def test_matrix_cli_replay_frontier_check_and_report(tmp_path, paths_file):
    db = str(tmp_path / "m.duckdb")
    runner = CliRunner()
    args = ["replay", str(DEMO), "--paths", str(paths_file), "--baseline", "tiny", "--limit", "12", "--chunk",
            "4", "--db", db] + [x for c in CANDIDATES for x in ("--candidate", c)]
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "matrix run 1" in result.output and "echo" in result.output
    out = runner.invoke(cli, ["frontier", "--db", db, "--max-call-drift", "20%", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert [r["candidate"] for r in data["overall"]["remedies"]] == REMEDIES
    assert data["overall"]["noise_floor"]["candidate"] == "tiny-b1"
    assert data["customers"] and all(c["recommendation"] for c in data["customers"])
    gate = runner.invoke(cli, ["check", "--db", db, "--max-call-drift", "20%", "--rule", "point"])
    assert gate.exit_code == 1
    assert "candidate echo (run 4)" in gate.output and "> max 20.00%" in gate.output
    assert "tiny-spec" in gate.output  # the passing candidates are listed too
    ok = runner.invoke(cli, ["check", "--db", db, "--max-call-drift", "100%"])
    assert ok.exit_code == 0, ok.output
    rep = runner.invoke(cli, ["report", "--db", db, "--all-customers", "--max-session-drift", "50%", "-o",
                              str(tmp_path / "reports")])
    assert rep.exit_code == 0, rep.output
    assert "recommended:" in rep.output
    folder = tmp_path / "reports" / "run-1"
    reports = sorted(p.name for p in folder.iterdir())
    assert reports and {p.rsplit(".", 1)[1] for p in reports} == {"html", "md", "json"}
    one = json.loads(next(folder.glob("*.json")).read_text())
    assert [r["candidate"] for r in one["frontier"]["remedies"]] == REMEDIES
    assert one["frontier"]["recommendation"]["choice"]
    html = next(folder.glob("*.html")).read_text()
    assert "<svg" in html and "echo" in html


def test_compare_with_several_candidate_logs_is_a_matrix_of_ordinary_compare_runs(tmp_path):
    base, cand = REPO / "traces" / "example_baseline.jsonl", REPO / "traces" / "example_candidate.jsonl"
    db = str(tmp_path / "c.duckdb")
    runner = CliRunner()
    single = runner.invoke(cli, ["compare", str(base), str(cand), "--db", db, "--json"])
    assert single.exit_code == 0, single.output
    alone = json.loads(single.output)
    matrix = runner.invoke(cli, ["compare", str(base), str(cand), str(base), "--candidate-name", "spec",
                                 "--candidate-name", "itself", "--db", db, "--run-name", "canary", "--json"])
    assert matrix.exit_code == 0, matrix.output
    data = json.loads(matrix.output)
    remedies = {r["candidate"]: r for r in data["overall"]["remedies"]}
    assert list(remedies) == ["spec", "itself"]
    assert remedies["itself"]["drifted_calls"] == 0
    assert (remedies["spec"]["calls"], remedies["spec"]["drifted_calls"]) == (alone["calls"], alone["drifted_calls"])
    assert remedies["spec"]["speedup"] is None and remedies["spec"]["pareto"] is None  # logs carry no timings
    with Store(db, read_only=True) as store:
        m = store.run_row(None)
        assert (m["kind"], m["name"], m["status"]) == ("matrix", "canary", "complete")
        assert [(r["name"], r["kind"]) for r in store.matrix_members(m["run_id"])] == \
            [("canary/spec", "compare"), ("canary/itself", "compare")]
        choice = frontier(store, m["run_id"], budget=Budget(max_call_drift=0.5)).recommendation
        assert choice.choice == "itself" and "speed was not measured" in choice.reason
    bad = runner.invoke(cli, ["compare", str(base), str(cand), str(base), "--candidate-name", "a",
                              "--candidate-name", "b", "--candidate-name", "c", "--db", db])
    assert bad.exit_code == 2 and "3 --candidate-name" in bad.output
    refused = runner.invoke(cli, ["merge", f"{db}@{m['run_id']}", "--db", str(tmp_path / "all.duckdb")])
    assert refused.exit_code != 0 and "is a remedy matrix" in refused.output


def test_session_drift_uses_the_traces_session_length_when_the_replay_samples_calls(tmp_path, paths_file):
    """One call per session replayed: the sessions stored have 1 matched call, but the customer's sessions in
    the traces are longer, and the implied session drift must be for those."""
    lines = [json.loads(x) for x in DEMO.read_text().splitlines() if x.strip()]
    sessions = Counter(x["request"]["metadata"]["session_id"] for x in lines)
    with Store(tmp_path / "m.duckdb") as store:
        matrix, _ = replay_traces(store, options(paths_file, calls_per_session=1))
        overall = frontier(store, matrix)
        assert all(r.session_calls == pytest.approx(len(lines) / len(sessions)) for r in overall.remedies)
        echo = next(r for r in overall.remedies if r.candidate == "echo")
        assert echo.session_drift == pytest.approx(1 - (1 - echo.rate.p) ** echo.session_calls)
        assert frontier(store, matrix, session_calls=2).remedies[0].session_calls == 2
