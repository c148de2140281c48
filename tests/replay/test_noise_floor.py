"""The noise floor: the baseline decoded again with other batch neighbours, and every candidate's drift read
beside it, paired by call (`analysis/floor.py`, `replay --noise-floor`, on by default in `demo`). The figures on a
compare matrix whose drift pattern is known; the replay plumbing on the tiny model."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner
from conftest import line, tool_call, write_jsonl

from toolaudit.analysis.floor import floor_figures
from toolaudit.analysis.stats import paired_difference
from toolaudit.cli import cli
from toolaudit.engines.paths import builtin_paths
from toolaudit.replay.inputs import noise_floor_path
from toolaudit.replay.runs import same_decoding
from toolaudit.store import Store


def test_paired_difference_counts_only_discordant_calls():
    same = paired_difference(4, 4, 100)
    assert same.estimate == 0 and same.low < 0 < same.high
    more = paired_difference(10, 1, 200)
    assert more.estimate == pytest.approx(9 / 200) and more.low > 0  # 10 vs 1 discordant: a real excess
    noise = paired_difference(3, 1, 200)
    assert noise.low < 0  # 3 vs 1 could be chance
    assert paired_difference(0, 0, 0).estimate == 0


def test_the_floor_path_is_the_baseline_with_other_batch_neighbours():
    target = builtin_paths()["target"]
    floor = noise_floor_path(target)
    assert (floor.name, floor.batch_size) == ("target-floor", target.batch_size // 2)
    assert same_decoding(target, floor)  # stored as a noise-floor run
    # A chunk that holds twice the rows: twice the rows (fewer steps than the baseline, other neighbours alike).
    assert noise_floor_path(target, chunk=2 * target.batch_size).batch_size == 2 * target.batch_size
    # Fewer calls per chunk than that: twice the rows would be the baseline's batches again, so half.
    assert noise_floor_path(target, chunk=2 * target.batch_size - 1).batch_size == target.batch_size // 2
    vllm = replace(target, engine="vllm", batch_size=8, options={"max_num_seqs": 16})
    assert noise_floor_path(vllm, chunk=64).options["max_num_seqs"] == 32
    assert noise_floor_path(vllm, chunk=31).options["max_num_seqs"] == 8  # the rows counted are the larger
    fixed = replace(target, options={"max_batch": 512})
    assert noise_floor_path(fixed, chunk=4096).options["max_batch"] == 256  # no bucket above 512
    remote = replace(target, engine="openai", batch_size=1, options={"concurrency": 8, "base_url": "http://x"})
    floor = noise_floor_path(remote, chunk=64)
    assert floor.batch_size == 2 and floor.options["concurrency"] == 4 and same_decoding(remote, floor)


def logs(tmp_path, drifted: dict[str, range], calls: int = 100):
    """A baseline log and one log per name, each drifting (limit 5 -> 50) on the given call numbers."""
    def log(name, which):
        rows = [line(session=f"s{i // 4:03d}", customer="acme" if i < 60 else "globex",
                     calls=[tool_call("search", {"q": "x", "limit": 50 if i in which else 5})]) for i in range(calls)]
        return str(write_jsonl(tmp_path / f"{name}.jsonl", rows))
    return log("base", range(0)), {name: log(name, which) for name, which in drifted.items()}


def test_a_candidate_reads_beside_its_floor_paired_by_call(tmp_path):
    base, cands = logs(tmp_path, {"spec": range(0, 15), "floor": range(10, 20)})
    db = str(tmp_path / "f.duckdb")
    made = CliRunner().invoke(cli, ["compare", base, cands["spec"], cands["floor"], "--candidate-name", "spec",
                                    "--candidate-name", "floor", "--db", db])
    assert made.exit_code == 0, made.output
    with Store(db) as store:
        matrix, spec, floor = (r["run_id"] for r in store.rows("SELECT run_id FROM runs ORDER BY run_id"))
        assert floor_figures(store, spec) is None  # no member says it is a floor yet
        store.update_options(floor, {"noise_floor": True})
        f = floor_figures(store, spec)
        assert (f.calls, f.only_candidate, f.only_floor, f.both) == (100, 10, 5, 5)
        assert (f.candidate.k, f.floor.k, f.excess.estimate) == (15, 10, pytest.approx(0.05))
        assert floor_figures(store, floor) is None  # the floor is not read beside itself
        acme = floor_figures(store, spec, "acme")  # calls 0-59: all of both drift patterns
        assert (acme.calls, acme.only_candidate, acme.only_floor) == (60, 10, 5)
    summary = CliRunner().invoke(cli, ["summary", "--db", db, "--run", str(matrix), "--json"])
    data = json.loads(summary.stdout)
    assert data["run_id"] == spec and data["noise_floor"]["excess"]["estimate"] == pytest.approx(0.05)
    (tool,) = data["noise_floor"]["tools"]  # one tool: its row is the whole run's
    assert (tool["tool_name"], tool["calls"], tool["only_candidate"], tool["only_floor"]) == ("search", 100, 10, 5)
    assert tool["floor_drift_rate"] == pytest.approx(0.10) and tool["excess"] == pytest.approx(0.05)
    globex = next(c for c in data["customers"] if c["customer"] == "globex")
    assert globex["floor_drift_rate"] == 0 and globex["excess"] == 0
    text = CliRunner().invoke(cli, ["summary", "--db", db, "--run", str(matrix)]).output
    assert "noise floor           10 (10.00%" in text
    assert "search  100    15.00%  10.00% (5.52%-17.44%)  +5.00pp" in text
    assert "beyond the floor      +5.00pp" in text and "10 drifted on the candidate only, 5 on the floor only" in text
    out = tmp_path / "reports"
    report = CliRunner().invoke(cli, ["report", "--db", db, "--run", str(spec), "--customer", "acme", "--as",
                                      "md", "-o", str(out)])
    assert report.exit_code == 0, report.output
    markdown = next(out.rglob("*.md")).read_text()
    assert "Drift beyond the noise floor, paired by call: +8.33 points" in markdown  # (10 - 5) of acme's 60


def test_replay_with_a_noise_floor_decodes_the_baseline_twice(tmp_path):
    """`replay --noise-floor` on the tiny model: a matrix of the candidate and `<baseline>-floor` (half the batch:
    6 calls are fewer than twice its 4),
    the floor marked as such, and `summary` of the run is the candidate's, with the floor beside it."""
    from conftest import REPO
    from helpers import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny")
    paths = tmp_path / "paths.toml"
    # random weights never end an answer (cut at max_tokens: truncated, not compared): stop strings end them
    table = (f'engine = "torch"\nmodel = "{model}"\ndtype = "float32"\nbatch_size = 4\nmax_tokens = 8\n'
             'stop = ["e", "a", "\\n"]\n')
    paths.write_text(f"[paths.tiny]\n{table}\n[paths.tiny-spec]\n{table}speculative = {{ method = \"ngram\", "
                     "num_speculative_tokens = 3 }\n")
    db = str(tmp_path / "r.duckdb")
    result = CliRunner().invoke(cli, ["replay", str(REPO / "traces" / "demo.jsonl"), "--paths", str(paths),
                                      "--baseline", "tiny", "--candidate", "tiny-spec", "--noise-floor",
                                      "--limit", "6", "--db", db])
    assert result.exit_code == 0, result.output
    assert "noise floor" in result.output and "beyond the floor" in result.output
    with Store(db) as store:
        runs = store.rows("SELECT run_id, kind, candidate_name, options FROM runs ORDER BY run_id")
        assert [(r["kind"], r["candidate_name"]) for r in runs] == [
            ("matrix", "tiny-spec, tiny-floor"), ("replay", "tiny-spec"), ("replay", "tiny-floor")]
        floor = json.loads(runs[2]["options"])
        assert floor["noise_floor"] is True and floor["candidate_config"]["batch_size"] == 2
        f = floor_figures(store, runs[1]["run_id"])
        assert f.calls == 6 and f.floor_path == "tiny-floor"


def test_the_baseline_as_its_own_candidate_is_decoded_with_other_neighbours(tmp_path):
    """`--candidate target` against `--baseline target` used to decode both copies in the same batches (always 0):
    the candidate is now the noise-floor path."""
    from toolaudit.replay.inputs import ReplayOptions, resolve_paths

    base, cands = resolve_paths(ReplayOptions(traces=[], baseline="target", candidate="target"))
    assert cands[0].name == "target-floor" and cands[0].batch_size == base.batch_size * 2  # chunks of 64 calls
    with pytest.raises(Exception, match="noise floor already"):
        resolve_paths(ReplayOptions(traces=[], baseline="target", candidate="target", noise_floor=True))
