"""Replay through the real torch engine on a tiny random-weight Llama with SmolLM2's real tokenizer.

The tiny model keeps these tests in seconds; the real SmolLM2 runs in test_engine_real.py. Interrupting a
replay (Ctrl-C in process, SIGKILL from outside) and resuming must give the same calls as an uninterrupted run,
none lost and none twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import REPO
from helpers import build_tiny_model

from toolaudit.cli import cli
from toolaudit.engines import Engine, make_engine
from toolaudit.replay.replayer import ReplayOptions, replay_traces
from toolaudit.store import Store

DEMO = REPO / "traces" / "demo.jsonl"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A 2-layer random Llama over SmolLM2's vocabulary, saved as a Hugging Face model directory."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture
def paths_file(tmp_path, tiny_model_dir) -> Path:
    text = f"""
[paths.tiny]
engine = "torch"
model = "{tiny_model_dir}"
dtype = "float32"
batch_size = 4
max_tokens = 12

[paths.tiny-spec]
engine = "torch"
model = "{tiny_model_dir}"
dtype = "float32"
batch_size = 4
max_tokens = 12
speculative = {{ method = "ngram", num_speculative_tokens = 3, prompt_lookup_min = 1, prompt_lookup_max = 3 }}
"""
    path = tmp_path / "paths.toml"
    path.write_text(text)
    return path


def options(paths_file: Path, limit: int = 24, **kw) -> ReplayOptions:
    return ReplayOptions(traces=[str(DEMO)], baseline="tiny", candidate="tiny-spec", paths_file=str(paths_file),
                         limit=limit, schema_dir=str(REPO / "schemas"), chunk=4, **kw)


def stored_calls(store: Store, run_id: int) -> list[tuple]:
    return store.query("""SELECT session_id, call_index, match_status, drift_kind, first_divergence
                          FROM calls WHERE run_id = ? ORDER BY session_id, call_index""", [run_id])[1]


def test_replay_stores_both_paths_with_evidence(tmp_path, paths_file):
    with Store(tmp_path / "r.duckdb") as store:
        run_id, counts = replay_traces(store, options(paths_file, limit=8))
        assert counts.calls == 8 and counts.replayed == 8 and counts.errors == 0
        outs = store.rows("SELECT * FROM outputs WHERE run_id = ? ORDER BY session_id, call_index, side", [run_id])
        assert len(outs) == 16
        for out in outs:
            assert out["token_ids"] and out["completion_tokens"] == len(out["token_ids"])
            assert out["prompt_tokens"] > 50 and out["tokens_per_s"] > 0
        spec = [o for o in outs if o["side"] == "candidate"]
        # random weights rarely repeat prompt n-grams, so proposals may be few; the counters are still recorded
        assert all(o["drafted_tokens"] is not None and o["forward_passes"] > 0 for o in spec)
        perf = {r["side"]: r for r in store.rows("SELECT * FROM path_performance WHERE run_id = ?", [run_id])}
        assert perf["baseline"]["calls"] == 8 and perf["baseline"]["drafted_tokens"] == 0
        # The candidate ran no prefill (the baseline's prompts were cached) and is charged what it reused: its
        # tokens/s is over wall time plus that, never over its decode time alone.
        cand = perf["candidate"]
        assert 0 < cand["reused_prefill_s"] < cand["wall_s"]
        assert cand["tokens_per_s"] == pytest.approx(cand["completion_tokens"] / cand["wall_s"])
        run = store.run_row(run_id)
        assert run["kind"] == "replay" and run["status"] == "complete"
        assert run["baseline_fingerprint"].startswith("fp-")
        assert run["baseline_fingerprint"] != run["candidate_fingerprint"]  # spec config differs
        # every drifted call with tokens on both sides has its divergence evidence
        for row in store.rows("SELECT * FROM calls WHERE run_id = ? AND drifted", [run_id]):
            assert row["first_divergence"] is not None and row["baseline_margin"] is not None


class _Interrupting:
    """Engine factory whose candidate engine raises KeyboardInterrupt on its Nth generate call."""

    def __init__(self, after: int):
        self.after, self.calls = after, 0

    def __call__(self, path):
        engine = make_engine(path)
        if "spec" not in path.name:
            return engine
        outer = self

        class Wrapped(Engine):
            name = engine.name
            capabilities = engine.capabilities

            def generate(self, requests):
                outer.calls += 1
                if outer.calls == outer.after:
                    raise KeyboardInterrupt
                return engine.generate(requests)

            def path_components(self):
                return engine.path_components()

            def decode_tokens(self, ids, keep_special=False):
                return engine.decode_tokens(ids, keep_special)

        return Wrapped(path)


def test_interrupted_replay_resumes_to_the_same_calls(tmp_path, paths_file):
    with Store(tmp_path / "full.duckdb") as store:
        full_id, _ = replay_traces(store, options(paths_file))
        full = stored_calls(store, full_id)
    with Store(tmp_path / "cut.duckdb") as store:
        with pytest.raises(KeyboardInterrupt):
            replay_traces(store, options(paths_file), engine_factory=_Interrupting(after=3))
        assert store.run_row(1)["status"] == "interrupted"
        partial = stored_calls(store, 1)
        assert len(partial) == 8  # two whole batches of 4, the third rolled back
        run_id, counts = replay_traces(store, options(paths_file), resume=1)
        assert run_id == 1 and counts.skipped == 8 and counts.replayed == 16
        assert stored_calls(store, 1) == full
        assert store.query("SELECT count(*) FROM outputs WHERE run_id = 1")[1][0][0] == 2 * len(full)
        assert store.run_row(1)["status"] == "complete"


def test_a_resume_whose_paths_changed_is_refused_and_the_run_keeps_its_calls(tmp_path, paths_file):
    """A paths file edited (or a build that decodes otherwise) between the interruption and the resume would
    decode the rest of the run as another path: refused, naming what changed; the stored calls stay; the
    restored file resumes the run to the uninterrupted run's calls."""
    with Store(tmp_path / "full.duckdb") as store:
        full = stored_calls(store, replay_traces(store, options(paths_file))[0])
    original = paths_file.read_text()
    with Store(tmp_path / "cut.duckdb") as store:
        with pytest.raises(KeyboardInterrupt):
            replay_traces(store, options(paths_file), engine_factory=_Interrupting(after=3))
        partial = stored_calls(store, 1)
        paths_file.write_text(original.replace("max_tokens = 12\n\n[paths.tiny-spec]", "max_tokens = 16\n\n"
                                               "[paths.tiny-spec]"))
        result = CliRunner().invoke(cli, ["replay", "--resume", "1", "--db", str(tmp_path / "cut.duckdb")])
        assert result.exit_code != 0
        assert "run 1 cannot go on" in result.output and "baseline 'tiny' max_tokens: 12 then, 16 now" in \
            result.output, result.output
        assert "candidate" not in result.output.split("cannot go on")[1].split(").")[0]  # only what changed
    with Store(tmp_path / "cut.duckdb") as store:
        assert stored_calls(store, 1) == partial and store.run_row(1)["status"] == "interrupted"
        paths_file.write_text(original)
        run_id, counts = replay_traces(store, options(paths_file), resume=1)
        assert run_id == 1 and counts.skipped == len(partial) and stored_calls(store, 1) == full


def _kill_after_progress(args: list[str], env: dict, calls: int) -> int:
    """Start a replay, read its progress lines (one per committed chunk when piped) and SIGKILL it as soon as one
    reports at least `calls` calls: the kill is keyed to stored progress, not to elapsed time, so a slow machine
    moves it in time but not in the run. Returns the calls the last progress line reported (0 if it finished
    before printing one)."""
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen = 0
    try:
        for line in proc.stderr:
            if line.startswith("replaying: "):
                seen = int(line.split()[1].split("/")[0])
                if seen >= calls:
                    proc.send_signal(signal.SIGKILL)
                    break
    finally:
        proc.wait(timeout=600)
        proc.stderr.close()
    return seen


def test_killed_replay_process_resumes_without_loss_or_duplicates(tmp_path, paths_file):
    db = tmp_path / "kill.duckdb"
    args = [sys.executable, "-m", "toolaudit", "replay", str(DEMO), "--paths", str(paths_file), "--baseline",
            "tiny", "--candidate", "tiny-spec", "--limit", "40", "--chunk", "4", "--db", str(db), "--schemas",
            str(REPO / "schemas")]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    reported = _kill_after_progress(args, env, calls=12)
    assert reported >= 12
    with Store(db) as store:
        before = store.query("SELECT count(*) FROM calls")[1][0][0]
        status = store.run_row(1)["status"]
    # the kill came after 3+ committed chunks and, in all but a vanishing case, before the last one
    assert before >= 12 and (status != "complete" or before == 40)
    result = CliRunner().invoke(cli, ["replay", "--resume", "1", "--db", str(db), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    # random weights never end an answer: every pair is truncated (stored, not compared)
    assert summary["calls"] + summary["not_compared"]["truncated"] == 40 and summary["status"] == "complete"
    with Store(tmp_path / "ref.duckdb") as ref:  # the same replay uninterrupted (in process: no second start-up)
        replay_traces(ref, options(paths_file, limit=40))
    with Store(db, read_only=True) as cut, Store(tmp_path / "ref.duckdb", read_only=True) as ref:
        assert stored_calls(cut, 1) == stored_calls(ref, 1)
        n, distinct = cut.query("SELECT count(*), count(DISTINCT (session_id, call_index, side)) FROM outputs")[1][0]
        assert n == distinct == 80


def test_replay_cli_errors(tmp_path, paths_file):
    runner = CliRunner()
    result = runner.invoke(cli, ["replay", "--db", str(tmp_path / "x.duckdb")])
    assert result.exit_code == 2 and "give trace files" in result.output
    result = runner.invoke(cli, ["replay", str(DEMO), "--candidate", "nope", "--db", str(tmp_path / "x.duckdb")])
    assert result.exit_code == 2 and "unknown decode path 'nope'" in result.output
    result = runner.invoke(cli, ["replay", str(tmp_path / "missing.jsonl"), "--db", str(tmp_path / "x.duckdb")])
    assert result.exit_code == 2 and "trace file not found" in result.output


def test_same_path_with_another_batch_size_is_a_noise_floor_run(tmp_path, paths_file):
    text = paths_file.read_text() + "\n[paths.tiny-b1]\n" + paths_file.read_text().split("[paths.tiny]")[1].split(
        "[paths.tiny-spec]")[0].replace("batch_size = 4", "batch_size = 1")
    paths_file.write_text(text)
    with Store(tmp_path / "nf.duckdb") as store:
        opts = ReplayOptions(traces=[str(DEMO)], baseline="tiny", candidate="tiny-b1", paths_file=str(paths_file),
                             limit=4, schema_dir=str(REPO / "schemas"))
        run_id, _ = replay_traces(store, opts)
        assert json.loads(store.run_row(run_id)["options"])["noise_floor"] is True
        run_id, _ = replay_traces(store, options(paths_file, limit=4))
        assert json.loads(store.run_row(run_id)["options"])["noise_floor"] is False


def _outputs(store: Store, run_id: int) -> list[tuple]:
    return store.query("""SELECT session_id, call_index, side, text, token_ids, drafted_tokens
                          FROM outputs WHERE run_id = ? ORDER BY ALL""", [run_id])[1]


def test_path_major_replay_equals_the_interleaved_one(tmp_path, paths_file):
    """One path over the whole selection, then the other (engines that cannot be held together): same rows,
    and nothing left staged."""
    with Store(tmp_path / "r.duckdb") as store:
        inter, _ = replay_traces(store, options(paths_file, limit=12, path_major=False))
        major, counts = replay_traces(store, options(paths_file, limit=12, path_major=True))
        assert counts.replayed == 12 and counts.errors == 0
        assert stored_calls(store, major) == stored_calls(store, inter)
        assert _outputs(store, major) == _outputs(store, inter)
        assert store.query("SELECT count(*) FROM staged_results")[1][0][0] == 0
        sides = store.query("""SELECT side, count(*), sum(calls) FROM replay_batches WHERE run_id = ?
                               GROUP BY side ORDER BY side""", [major])[1]
        assert sides == [("baseline", 3, 12), ("candidate", 3, 12)]


def test_interrupted_path_major_replay_resumes_to_the_same_calls(tmp_path, paths_file):
    """Killed in the candidate pass: the staged baseline results survive, the resume runs only what is left."""
    with Store(tmp_path / "full.duckdb") as store:
        full_id, _ = replay_traces(store, options(paths_file, limit=16, path_major=True))
        full = stored_calls(store, full_id)
    with Store(tmp_path / "cut.duckdb") as store:
        with pytest.raises(KeyboardInterrupt):
            replay_traces(store, options(paths_file, limit=16, path_major=True),
                          engine_factory=_Interrupting(after=3))
        assert len(stored_calls(store, 1)) == 8  # two candidate chunks of 4 paired, the third rolled back
        assert store.query("SELECT count(*) FROM staged_results WHERE run_id = 1")[1][0][0] == 8
        run_id, counts = replay_traces(store, options(paths_file, limit=16, path_major=True), resume=1)
        assert counts.skipped == 8 and counts.replayed == 8
        assert stored_calls(store, 1) == full
        assert store.query("SELECT count(*) FROM staged_results")[1][0][0] == 0
        assert store.query("SELECT count(*) FROM outputs WHERE run_id = 1")[1][0][0] == 2 * len(full)
