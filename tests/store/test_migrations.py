"""Migrations: exact columns of a fresh file, views generated from the vocabulary, every column documented."""

from __future__ import annotations

import re

from conftest import REPO

from toolaudit.compare.vocabulary import DRIFTED_KINDS
from toolaudit.store import Store
from toolaudit.store.migrations import MIGRATIONS

EXPECTED_TABLES = {
    "schema_migrations": ["version", "name", "applied_at"],
    "runs": ["run_id", "name", "kind", "status", "created_at", "finished_at", "baseline_name", "candidate_name",
             "baseline_source", "candidate_source", "baseline_fingerprint", "candidate_fingerprint", "options",
             "counts", "toolaudit_version", "matrix_id"],
    "calls": ["run_id", "session_id", "call_index", "customer", "tool_name", "match_status", "drift_kind",
              "drifted", "exact_text_match", "baseline_valid", "candidate_valid", "arg_diff_count", "detail"],
    "arg_diffs": ["run_id", "session_id", "call_index", "call_position", "tool_name", "arg_path", "diff_kind",
                  "baseline_value", "candidate_value"],
    "sessions": ["run_id", "session_id", "customer", "calls", "matched_calls", "drifted_calls", "any_drift",
                 "compounded_p"],
    "trace_errors": ["run_id", "side", "source", "line", "field", "message", "excerpt"],
    "schema_issues": ["run_id", "tool_name", "schema_source", "severity", "message"],
}
VIEWS = ["call_drift", "session_drift", "customer_drift", "tool_drift", "argument_drift", "path_performance",
         "frontier", "customer_frontier"]


def columns(store, table):
    return [r[0] for r in store.query(
        "SELECT column_name FROM information_schema.columns WHERE table_name = ? ORDER BY ordinal_position",
        [table])[1]]


def test_empty_database_migrates_to_exact_columns(db_path):
    with Store(db_path) as store:
        assert store.schema_version() == MIGRATIONS[-1][0]
        for table, cols in EXPECTED_TABLES.items():
            assert columns(store, table)[:len(cols)] == cols, table
        for view in VIEWS:
            assert columns(store, view), view
    with Store(db_path) as store:  # re-opening applies nothing twice
        n = store.query("SELECT count(*) FROM schema_migrations")[1][0][0]
        assert n == len(MIGRATIONS)


def test_every_column_and_view_is_documented(db_path):
    """Walks information_schema, not a hand-kept list: a new table, view or column fails until documented."""
    doc = (REPO / "docs" / "schema.md").read_text()
    with Store(db_path) as store:
        names = [r[0] for r in store.query("SELECT table_name FROM information_schema.tables "
                                           "WHERE table_schema = 'main' ORDER BY table_name")[1]]
        assert set(EXPECTED_TABLES) | set(VIEWS) | {"outputs", "replay_batches"} <= set(names)
        for name in names:
            assert re.search(rf"^#+ `{name}`", doc, re.M), f"{name} missing from docs/schema.md"
            for col in columns(store, name):
                assert f"`{col}`" in doc, f"{name}.{col} undocumented"


def test_newer_schema_is_refused(db_path):
    with Store(db_path) as store:
        store.con.execute("INSERT INTO schema_migrations VALUES (999, 'future', now())")
    import pytest

    from toolaudit import StoreError
    with pytest.raises(StoreError, match="newer than this toolaudit"):
        Store(db_path, read_only=True)


def test_wilson_macro_matches_python(db_path):
    from toolaudit.analysis.stats import wilson
    with Store(db_path) as store:
        for k, n in [(0, 10), (3, 250), (12, 1000), (50, 50)]:
            lo, hi = store.query("SELECT wilson_low(?, ?), wilson_high(?, ?)", [k, n, k, n])[1][0]
            rate = wilson(k, n)
            assert abs(lo - rate.low) < 1e-12 and abs(hi - rate.high) < 1e-12


def test_tool_drift_has_a_column_per_drifted_kind(db_path):
    with Store(db_path) as store:
        assert columns(store, "tool_drift")[7:] == [k.value for k in DRIFTED_KINDS]


def test_a_version_6_database_migrates_and_its_runs_read_as_matrices_of_one(tmp_path):
    """Existing databases keep working: the runs written before migration 7 get `matrix_id` NULL and show in
    the frontier views as a matrix of one candidate."""
    import duckdb

    path = tmp_path / "v6.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, "
                "applied_at TIMESTAMP NOT NULL)")
    for version, name, sql in MIGRATIONS[:6]:
        con.execute(sql)
        con.execute("INSERT INTO schema_migrations VALUES (?, ?, now())", [version, name])
    con.execute("""INSERT INTO runs (run_id, name, kind, status, created_at, baseline_name, candidate_name)
                   VALUES (1, 'old', 'replay', 'complete', now(), 'target', 'spec-ngram')""")
    for i, drifted in enumerate([False, True, False, False]):
        con.execute("""INSERT INTO calls (run_id, session_id, call_index, customer, tool_name, match_status,
                       drift_kind, drifted) VALUES (1, 's', ?, 'acme', 't', 'matched', ?, ?)""",
                    [i, "arguments_changed" if drifted else "identical", drifted])
    con.execute("INSERT INTO sessions VALUES (1, 's', 'acme', 4, 4, 1, true, 0.5)")
    con.close()
    with Store(path) as store:
        assert store.schema_version() == MIGRATIONS[-1][0]
        row = store.rows("SELECT * FROM frontier")[0]
        assert (row["matrix_id"], row["run_id"], row["candidate"], row["calls"], row["drifted_calls"]) == \
            (1, 1, "spec-ngram", 4, 1)
        assert row["mean_calls_per_session"] == 4 and abs(row["session_drift"] - (1 - 0.75 ** 4)) < 1e-12
        assert row["speedup"] is None and row["pareto"] is None  # no timings recorded
        assert store.rows("SELECT customer, calls FROM customer_frontier") == [{"customer": "acme", "calls": 4}]
        assert store.run_row(None)["run_id"] == 1
