"""`replay --ray`: the same replay through a local Ray (Ray Data, engine workers as actors) stores the same tables
as in process, also when a worker is killed mid-run, and `--ray` without Ray names the extra to install.

One local Ray for both Ray test modules (`ray_support.local_ray`), two CPUs, the tiny float32 model on one thread."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from compare.test_shards import TABLES, rows_of, summary_json
from conftest import REPO
from helpers import build_tiny_model
from ray_support import KillFirstWorker, open_gate_actor
from ray_support import local_ray as start_local_ray

from toolaudit.engines import make_engine
from toolaudit.replay.inputs import load_calls
from toolaudit.replay.replayer import ReplayOptions, replay_traces
from toolaudit.store import Store

DEMO = REPO / "traces" / "demo.jsonl"
# wall-clock dependent columns: everything else must be equal
TIMING = ("latency_s", "ttft_s", "tokens_per_s", "wall_s", "reused_prefill_s", "speedup", "wall_share_s")


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    return start_local_ray(tmp_path_factory, __name__)


@pytest.fixture(scope="module")
def paths_file(tmp_path_factory) -> Path:
    model = build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))
    text = ""
    for name, extra in (("tiny", ""), ("tiny-b1", ""), ("tiny-spec", 'speculative = { method = "ngram", '
                        'num_speculative_tokens = 3, prompt_lookup_min = 1, prompt_lookup_max = 3 }')):
        batch = 1 if name == "tiny-b1" else 2
        text += (f'[paths.{name}]\nengine = "torch"\nmodel = "{model}"\ndtype = "float32"\nbatch_size = {batch}\n'
                 f'max_tokens = 8\nthreads = 1\n{extra}\n')
    path = tmp_path_factory.mktemp("paths") / "paths.toml"
    path.write_text(text)
    return path


def options(paths_file: Path, **kw) -> ReplayOptions:
    return ReplayOptions(traces=[str(DEMO)], baseline="tiny", candidate="tiny-spec", paths_file=str(paths_file),
                         limit=12, schema_dir=str(REPO / "schemas"), chunk=2, **kw)


def assert_same_tables(a_db: Path, b_db: Path, run_ids: tuple[int, ...] = (1,)) -> None:
    """Every table and view the shard tests compare, the runs' fingerprints, and `summary --json`."""
    with Store(a_db, read_only=True) as a, Store(b_db, read_only=True) as b:
        for run_id in run_ids:
            for table in TABLES:
                assert rows_of(a, table, run_id, TIMING) == rows_of(b, table, run_id, TIMING), (run_id, table)
            assert rows_of(a, "calls", run_id)
        runs = "SELECT run_id, kind, baseline_fingerprint, candidate_fingerprint, status FROM runs ORDER BY run_id"
        assert a.query(runs)[1] == b.query(runs)[1]
    for run_id in run_ids:
        assert _untimed(summary_json(a_db, run_id)) == _untimed(summary_json(b_db, run_id))


def _untimed(value):
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if k not in TIMING and "per_s" not in k
                and not k.endswith("_at")}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


@dataclass
class GatedFactory:
    """The registry's engines, whose engine calls outside the first chunk wait until the test opens `gate` (a
    Ray actor): the test kills a worker while every later chunk is still in flight, not by timing."""

    first_keys: frozenset[str]
    gate: object

    def __call__(self, path):
        import ray

        engine = make_engine(path)
        generate = engine.generate

        def gated(requests):
            if not self.first_keys.issuperset(r.key for r in requests):
                ray.get(self.gate.wait.remote(), timeout=30)  # GetTimeoutError if the gate never opens
            return generate(requests)

        engine.generate = gated
        return engine


def test_ray_replay_equals_in_process_when_a_worker_is_killed(tmp_path, local_ray, paths_file):
    from toolaudit.compare.ray_cluster import RayOptions
    from toolaudit.replay.ray_pool import RayEnginePool

    one, two = tmp_path / "one.duckdb", tmp_path / "ray.duckdb"
    with Store(one) as store:
        replay_traces(store, options(paths_file))
    calls = load_calls(options(paths_file))[0]
    gate = open_gate_actor()
    # one worker: killed while its next chunk waits at the gate, restarted by Ray, the chunk retried (a worker
    # start imports torch and the engine: ~5 s a process on one core)
    pool = RayEnginePool(RayOptions(workers=1), factory=GatedFactory(
        frozenset(f"{c.session_id}\x1f{c.call_index}" for c in calls[:2]), gate))
    kill_first_worker = KillFirstWorker(pool, gate)
    killed = kill_first_worker.killed

    with Store(two) as store:
        run_id, counts = replay_traces(store, options(paths_file), engines=pool, progress=kill_first_worker)
        keys = store.query("SELECT session_id, call_index FROM calls WHERE run_id = 1")[1]
    assert killed and counts.replayed == 12 and counts.errors == 0
    assert len(keys) == len(set(keys)) == 12  # every call stored once
    pids = {pid for _, pid in pool.workers_seen}
    assert len(pids) >= 2, pool.workers_seen  # the worker and the one Ray restarted after the kill
    assert_same_tables(one, two)


def test_ray_remedy_matrix_path_major_equals_in_process(tmp_path, local_ray, paths_file):
    """Baseline once, then each candidate, one pipeline per pass; a resumed run skips what is stored."""
    from toolaudit.compare.ray_cluster import RayOptions
    from toolaudit.replay.ray_pool import RayEnginePool

    opts = options(paths_file, candidates=["tiny-spec", "tiny-b1"], path_major=True)
    one, two = tmp_path / "one.duckdb", tmp_path / "ray.duckdb"
    with Store(one) as store:
        replay_traces(store, opts)
        replay_traces(store, opts, resume=1)  # as below: the runs' counts say what the last invocation did
    with Store(two) as store:
        run_id, counts = replay_traces(store, opts, engines=RayEnginePool(RayOptions(workers=1)))
        assert run_id == 1 and counts.replayed == 12
        _, again = replay_traces(store, opts, resume=1, engines=RayEnginePool(RayOptions(workers=1)))
        assert again.skipped == 12 and again.replayed == 0
    assert_same_tables(one, two, run_ids=(2, 3))


def test_ray_without_ray_names_the_extra(tmp_path):
    code = ("import sys; sys.modules['ray'] = None\n"
            "from toolaudit.cli import cli\n"
            f"cli(['replay', {str(DEMO)!r}, '--ray', '--limit', '1', '--db', {str(tmp_path / 'x.duckdb')!r}])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert out.returncode != 0
    assert "pip install 'toolaudit[ray]'" in out.stderr, out.stderr


def test_ray_option_refuses_a_trace_file_as_its_address(tmp_path):
    from click.testing import CliRunner

    from toolaudit.cli import cli

    result = CliRunner().invoke(cli, ["replay", "--ray", str(DEMO), "--db", str(tmp_path / "x.duckdb")])
    assert result.exit_code == 2 and "put --ray after the trace files" in result.output
    result = CliRunner().invoke(cli, ["replay", str(DEMO), "--ray-workers", "2", "--db", str(tmp_path / "x.duckdb")])
    assert result.exit_code == 2 and "--ray-workers needs --ray" in result.output
