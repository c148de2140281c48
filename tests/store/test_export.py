"""`toolaudit export`: every table and view to Parquet / CSV, read back with pyarrow and DuckDB."""

from __future__ import annotations

import csv

import duckdb
import pyarrow.parquet as pq
from click.testing import CliRunner
from conftest import REPO

from toolaudit.cli import cli
from toolaudit.compare.logs import CompareOptions, compare_logs
from toolaudit.store import Store

BASELINE = REPO / "traces" / "example_baseline.jsonl"
CANDIDATE = REPO / "traces" / "example_candidate.jsonl"


def _two_runs(db):
    with Store(db) as store:
        for _ in range(2):
            compare_logs(store, BASELINE, CANDIDATE, CompareOptions(schema_dir=None))


def test_parquet_export_of_one_run_reads_back(tmp_path):
    db = tmp_path / "t.duckdb"
    _two_runs(db)
    out = tmp_path / "pq"
    result = CliRunner().invoke(cli, ["export", "--db", str(db), "-o", str(out), "--run", "2"])
    assert result.exit_code == 0, result.output
    with Store(db, read_only=True) as store:
        names = [r[0] for r in store.query("SELECT table_name FROM information_schema.tables "
                                           "WHERE table_schema = 'main'")[1]]
        assert {p.stem for p in out.glob("*.parquet")} == set(names)
        for view in ("calls", "outputs", "call_drift", "customer_drift", "argument_drift"):
            table = pq.read_table(out / f"{view}.parquet")
            expected = store.query(f"SELECT * FROM {view} WHERE run_id = 2 ORDER BY ALL")[1]
            assert table.num_rows == len(expected) > 0
            assert set(table.column("run_id").to_pylist()) == {2}
            back = duckdb.connect().execute(f"SELECT * FROM read_parquet('{out / f'{view}.parquet'}') "
                                            "ORDER BY ALL").fetchall()
            assert back == expected, view
    assert pq.read_table(out / "runs.parquet").column("run_id").to_pylist() == [2]
    assert pq.read_table(out / "schema_migrations.parquet").num_rows > 0  # no run column: whole


def test_csv_export_of_every_run(tmp_path):
    db = tmp_path / "t.duckdb"
    _two_runs(db)
    result = CliRunner().invoke(cli, ["export", "--db", str(db), "--as", "csv", "-o", str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    with open(tmp_path / "c" / "tool_drift.csv") as fh:
        rows = list(csv.DictReader(fh))
    with Store(db, read_only=True) as store:
        assert len(rows) == store.query("SELECT count(*) FROM tool_drift")[1][0][0]
    assert {r["run_id"] for r in rows} == {"1", "2"}
    bad = CliRunner().invoke(cli, ["export", "--db", str(db), "-o", str(tmp_path / "x"), "--run", "9"])
    assert bad.exit_code == 2 and "no run with id 9" in bad.output
