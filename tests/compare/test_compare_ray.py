"""`compare --ray`: the logs' ranges scanned by Ray actors (Ray Data) store the same tables as an in-process
compare, for a remedy matrix, for an OTLP export (ranges settled in the driver) and when a worker is killed
mid-run; `--ray` without Ray names the extra to install.

One local Ray for both Ray test modules (`ray_support.local_ray`), two CPUs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import REPO, write_jsonl
from format_records import otlp, span
from ingest.test_otlp_inherit import _records
from ray_support import KillFirstWorker, open_gate_actor
from ray_support import local_ray as start_local_ray

from compare.test_shards import TABLES, rows_of
from toolaudit import ConfigError
from toolaudit.cli import cli
from toolaudit.compare.logs import CompareOptions, compare_logs
from toolaudit.compare.scan import scan_task
from toolaudit.ingest.sources import SMALL
from toolaudit.store import Store

BASELINE = REPO / "traces" / "example_baseline.jsonl"
CANDIDATE = REPO / "traces" / "example_candidate.jsonl"
SCHEMAS = str(REPO / "schemas")
RUNS = "SELECT run_id, name, kind, status, baseline_name, candidate_name, baseline_source, candidate_source, " \
       "options, counts FROM runs ORDER BY run_id"


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    return start_local_ray(tmp_path_factory, __name__)


def invoke(*args: str) -> str:
    """The command's stdout (Ray's own log lines may land on stderr)."""
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def summary_json(db: Path, run_id: int) -> dict:
    out = json.loads(invoke("summary", "--db", str(db), "--run", str(run_id), "--json"))
    for key in ("run_id", "run_name", "errors_sql", "schema_issues_sql"):
        out.pop(key)
    return out


def assert_same_tables(a_db: Path, b_db: Path) -> None:
    """Every run row (options and counts included), every table and view of the shard tests, `summary --json`."""
    with Store(a_db, read_only=True) as a, Store(b_db, read_only=True) as b:
        runs = a.query(RUNS)[1]
        assert runs == b.query(RUNS)[1] and all(r[3] == "complete" for r in runs)
        compared = [r[0] for r in runs if r[2] == "compare"]
        for run_id in compared:
            for table in TABLES:
                assert rows_of(a, table, run_id) == rows_of(b, table, run_id), (run_id, table)
            assert rows_of(a, "calls", run_id)  # not vacuous
    for run_id in compared:
        assert summary_json(a_db, run_id) == summary_json(b_db, run_id)


def test_ray_compare_matrix_equals_in_process(tmp_path, local_ray):
    """`compare BASE A B --ray`: two ordinary compare runs of one matrix, every table as in process (one worker:
    one range per side; the tests below cut the logs into 8 ranges per side)."""
    args = [str(BASELINE), str(CANDIDATE), str(BASELINE), "--schemas", SCHEMAS, "--json"]
    one, two = tmp_path / "one.duckdb", tmp_path / "ray.duckdb"
    local = json.loads(invoke("compare", *args, "--db", str(one)))
    through_ray = json.loads(invoke("compare", *args, "--ray", "--ray-workers", "1", "--db", str(two)))
    assert local == through_ray
    assert_same_tables(one, two)
    with Store(two, read_only=True) as store:
        assert store.query("SELECT count(*) FROM runs WHERE kind = 'compare' AND matrix_id = 1")[1] == [(2,)]


def test_ray_compare_of_an_otlp_export_settles_its_ranges_in_the_driver(tmp_path, local_ray):
    """A settling source: each range's notes come back from its worker; the driver settles them."""
    from toolaudit.compare.ray_cluster import RayOptions
    from toolaudit.compare.ray_scan import RayScans

    records = _records()
    filler = [otlp(*(span(f"f{i:05d}{j:010d}", {"http.method": "GET", "http.url": "x" * 200}, trace_id="f" * 32)
                     for j in range(4))) for i in range(800)]
    path = write_jsonl(tmp_path / "spans.jsonl", records[:3] + filler + records[3:])  # the agent span comes later
    assert path.stat().st_size > SMALL  # cut into ranges
    one, two = tmp_path / "one.duckdb", tmp_path / "ray.duckdb"
    with Store(one) as store:
        compare_logs(store, path, path, CompareOptions(schema_dir=None))  # one range: a sequential read
    scans = RayScans(RayOptions(workers=2))
    with Store(two) as store:
        _, counts = compare_logs(store, path, path, CompareOptions(schema_dir=None), scans=scans)
    assert counts.matched == 4 and len(scans.workers_seen) == 16  # 8 ranges per side
    assert_same_tables(one, two)


@dataclass
class GatedScan:
    """`scan_task`, whose ranges other than the first wait until the test opens `gate` (a Ray actor): the test
    kills a worker while every later range is still in flight, not by timing."""

    first: tuple[int, int]  # (side, start) of the first range
    gate: object

    def __call__(self, task: tuple):
        import ray

        if (task[0], task[1]) != self.first:
            ray.get(self.gate.wait.remote(), timeout=30)  # GetTimeoutError if the gate never opens
        return scan_task(task)


def test_ray_compare_equals_in_process_when_a_worker_is_killed(tmp_path, local_ray):
    from toolaudit.compare.ray_cluster import RayOptions
    from toolaudit.compare.ray_scan import RayScans

    options = CompareOptions(schema_dir=SCHEMAS)
    one, two = tmp_path / "one.duckdb", tmp_path / "ray.duckdb"
    with Store(one) as store:
        _, local_counts = compare_logs(store, BASELINE, CANDIDATE, options)
    gate = open_gate_actor()
    scans = RayScans(RayOptions(workers=2), scan=GatedScan((0, 0), gate))
    kill_first_worker = KillFirstWorker(scans, gate)
    killed = kill_first_worker.killed

    with Store(two) as store:
        _, counts = compare_logs(store, BASELINE, CANDIDATE, options, progress=kill_first_worker, scans=scans)
        for table, key in (("calls", "session_id, call_index"), ("outputs", "session_id, call_index, side"),
                           ("trace_errors", "side, line")):
            n, distinct = store.query(f"SELECT count(*), count(DISTINCT ({key})) FROM {table}")[1][0]
            assert n == distinct, table  # nothing stored twice
    assert killed and counts.as_dict() == local_counts.as_dict()
    assert len(scans.workers_seen) == 16  # 8 ranges per side, each received once
    pids = {pid for _, pid in scans.workers_seen}
    assert len(pids) >= 3, scans.workers_seen  # the two workers and the one Ray restarted after the kill
    assert_same_tables(one, two)


def test_ray_compare_without_ray_names_the_extra(tmp_path):
    code = ("import sys; sys.modules['ray'] = None\n"
            "from toolaudit.cli import cli\n"
            f"cli(['compare', {str(BASELINE)!r}, {str(CANDIDATE)!r}, '--ray', '--db', "
            f"{str(tmp_path / 'x.duckdb')!r}])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert out.returncode != 0
    assert "pip install 'toolaudit[ray]'" in out.stderr, out.stderr
    assert not (tmp_path / "x.duckdb").exists()  # refused before a store was opened


def test_ray_compare_options_are_checked(tmp_path):
    db = str(tmp_path / "x.duckdb")
    result = CliRunner().invoke(cli, ["compare", "--ray", str(BASELINE), str(CANDIDATE), "--db", db])
    assert result.exit_code == 2 and "put --ray after the trace files" in result.output
    result = CliRunner().invoke(cli, ["compare", str(BASELINE), str(CANDIDATE), "--ray-workers", "2", "--db", db])
    assert result.exit_code == 2 and "--ray-workers needs --ray" in result.output
    result = CliRunner().invoke(cli, ["compare", str(BASELINE), str(CANDIDATE), "--ray", "--workers", "2",
                                      "--db", db])
    assert result.exit_code == 2 and "with --ray, use --ray-workers" in result.output


def failing_scan(task: tuple):
    raise ConfigError(f"cannot scan range {task[1]}-{task[2]}")


def test_a_worker_that_raises_stops_the_run_with_its_message(tmp_path, local_ray):
    """Set-up or scan, what a worker raises reaches the driver as the library's error (the CLI prints it in one
    line), and the compare run is left `interrupted`."""
    from toolaudit.compare.ray_cluster import PickledWorker, RayOptions, ordered_map
    from toolaudit.compare.ray_scan import RayScans

    class Refusing(PickledWorker):
        def __init__(self):
            super().__init__()
            raise ConfigError(f"refused on {self.node}")

    with pytest.raises(ConfigError, match=r"^refused on "):
        list(ordered_map(RayOptions(workers=1), [1, 2], Refusing, {}, 1, {"num_cpus": 1}))
    with Store(tmp_path / "x.duckdb") as store:
        with pytest.raises(ConfigError, match=r"^cannot scan range 0-"):
            compare_logs(store, BASELINE, CANDIDATE, CompareOptions(schema_dir=None),
                         scans=RayScans(RayOptions(workers=1), scan=failing_scan))
        assert store.query("SELECT status FROM runs")[1] == [("interrupted",)]
