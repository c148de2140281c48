"""Migrations: exact columns of a fresh file, views generated from the vocabulary, every column documented."""

from __future__ import annotations

import re

from conftest import REPO

from toolaudit.store import Store
from toolaudit.store.db import SESSIONS_SQL
from toolaudit.store.migrations import MIGRATIONS
from toolaudit.store.vocabulary import DRIFTED_KINDS

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
    "replay_chunks": ["run_id", "chunk_no", "side", "path_name", "calls", "wall_s", "completion_tokens",
                      "drafted_tokens", "accepted_tokens", "forward_passes", "errors", "reused_prefill_s"],
}
VIEWS = ["call_drift", "session_drift", "customer_drift", "tool_drift", "argument_drift", "path_performance",
         "frontier", "customer_frontier", "replay_batches", "sampled_call_shifts"]



def database_at(path, version: int, applied_at: str = "now()"):
    """A DuckDB file as toolaudit left it at schema `version` (migrations 1..version applied at `applied_at`, an
    SQL timestamp), open for the test to write old rows into."""
    import duckdb

    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, "
                "applied_at TIMESTAMP NOT NULL)")
    for number, name, sql in MIGRATIONS[:version]:
        con.execute(sql)
        con.execute(f"INSERT INTO schema_migrations VALUES (?, ?, {applied_at})", [number, name])
    return con

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
        assert set(EXPECTED_TABLES) | set(VIEWS) | {"outputs", "staged_results"} <= set(names)
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

    path = tmp_path / "v6.duckdb"
    con = database_at(path, 6)
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


def test_released_migrations_are_never_edited():
    """A released migration's SQL stays what it was (a changed view gets a new migration, and the view builders
    take the version that calls them): the SHA-256 of each, first 16 hex digits."""
    import hashlib

    released = {1: "06843fb7b8c4331e", 2: "1628222e1ca0f18b", 3: "447ca400bba5e140", 4: "f9ce5d3de2ebe7f5",
                5: "74fef413f4d87360", 6: "f9ce5d3de2ebe7f5", 7: "dbb019af52ea4fc4", 8: "ac66b880125ccb84",
                9: "bcdd06283f588d58"}
    assert {v: hashlib.sha256(sql.encode()).hexdigest()[:16] for v, _, sql in MIGRATIONS if v in released} == released


def _version_7_database(path):
    """A file as toolaudit wrote it before migration 8: a replay run with two chunks per side, three sessions."""

    con = database_at(path, 7)
    con.execute("""INSERT INTO runs (run_id, name, kind, status, created_at, baseline_name, candidate_name)
                   VALUES (1, 'old', 'replay', 'complete', now(), 'target', 'spec-ngram')""")
    for no, side, wall in [(0, "baseline", 2.0), (0, "candidate", 1.0), (1, "baseline", 2.0), (1, "candidate", 1.0)]:
        con.execute("INSERT INTO replay_batches (run_id, batch_no, side, path_name, calls, wall_s, completion_tokens) "
                    "VALUES (1, ?, ?, ?, 4, ?, 40)", [no, side, side, wall])
    # acme: tool t drifts in 1 of its 4 calls, tool u in 2 of 4 (run-wide u: 2 of 6 with globex's calls)
    calls = [("s1", "acme", "t", True), ("s1", "acme", "t", False), ("s2", "acme", "t", False),
             ("s2", "acme", "t", False), ("s3", "acme", "u", True), ("s3", "acme", "u", True),
             ("s3", "acme", "u", False), ("s3", "acme", "u", False), ("s4", "globex", "u", False),
             ("s4", "globex", "u", False)]
    for i, (session, customer, tool, drifted) in enumerate(calls):
        con.execute("""INSERT INTO calls (run_id, session_id, call_index, customer, tool_name, match_status,
                       drift_kind, drifted) VALUES (1, ?, ?, ?, ?, 'matched', ?, ?)""",
                    [session, i, customer, tool, "arguments_changed" if drifted else "identical", drifted])
    con.execute(SESSIONS_SQL, [1, 1])  # what finish_run writes
    con.close()


def test_a_version_7_database_reads_through_the_new_names_and_the_old(tmp_path):
    """Migration 8 renames replay_batches to replay_chunks (batch_no to chunk_no) and names the two compounded
    session figures apart; a file written before it opens (read-only too: it is upgraded first), its rows read
    through the new names, and the old names still answer for one release."""
    path = tmp_path / "v7.duckdb"
    _version_7_database(path)
    with Store(path, read_only=True) as store:
        assert store.schema_version() == MIGRATIONS[-1][0]
        assert store.query("SELECT chunk_no, side, wall_s FROM replay_chunks ORDER BY ALL")[1] == [
            (0, "baseline", 2.0), (0, "candidate", 1.0), (1, "baseline", 2.0), (1, "candidate", 1.0)]
        assert store.query("SELECT batch_no, side FROM replay_batches ORDER BY ALL")[1][0] == (0, "baseline")
        perf = {r["side"]: r for r in store.rows("SELECT * FROM path_performance")}
        assert perf["candidate"]["tokens_per_s"] == 40.0 and perf["baseline"]["calls"] == 8
        acme = store.rows("SELECT * FROM customer_drift WHERE customer = 'acme'")[0]
        # run-wide rates t 1/4, u 2/6 (acme's own u rate, 2/4, is not this figure)
        run_rates = [1 - 0.75 ** 2, 1 - 0.75 ** 2, 1 - (2 / 3) ** 4]  # sessions s1, s2 (two t calls), s3
        assert abs(acme["compounded_session_drift_run_rates"] - sum(run_rates) / 3) < 1e-12
        assert acme["compounded_session_drift"] == acme["compounded_session_drift_run_rates"]  # deprecated alias
    with Store(path) as store:  # a resumed replay numbers its next chunk after the old ones
        assert store.next_chunk_no(1) == 2


def test_a_version_8_database_opens_its_old_calls_read_as_before_and_new_runs_store_finish_and_digest(tmp_path):
    """Migration 9 adds `outputs.finish_reason` and `outputs.request_digest`: a file written before it opens
    (read-only too: it is upgraded first), its rows keep their figures with both columns NULL (unknown, so
    nothing is called truncated or mismatched after the fact), and a new comparison writes both."""
    from conftest import line, tool_call, write_jsonl

    from toolaudit.analysis.figures import run_summary
    from toolaudit.compare.logs import CompareOptions, compare_logs

    path = tmp_path / "v8.duckdb"
    con = database_at(path, 8)
    con.execute("""INSERT INTO runs (run_id, name, kind, status, created_at, baseline_name, candidate_name)
                   VALUES (1, 'old', 'compare', 'complete', now(), 'baseline', 'candidate')""")
    con.execute("SELECT nextval('run_id_seq')")  # as create_run took the id
    for i, kind in enumerate(["identical", "unparseable", "identical"]):
        con.execute("""INSERT INTO calls (run_id, session_id, call_index, tool_name, match_status, drift_kind,
                       drifted) VALUES (1, 's', ?, 't', 'matched', ?, ?)""", [i, kind, kind != "identical"])
        for side in ("baseline", "candidate"):
            con.execute("INSERT INTO outputs (run_id, session_id, call_index, side, text, parse_status) "
                        "VALUES (1, 's', ?, ?, 'x', 'ok')", [i, side])
    con.execute(SESSIONS_SQL, [1, 1])
    con.close()
    with Store(path, read_only=True) as store:
        assert store.schema_version() == MIGRATIONS[-1][0] >= 9
        assert store.query("SELECT count(*) FROM outputs WHERE finish_reason IS NULL AND request_digest IS NULL")[1] \
            == [(6,)]
        old = run_summary(store, 1)
        assert (old["calls"], old["drifted_calls"], old["not_compared"]) == (3, 1, {"truncated": 0, "mismatched": 0})
    log = write_jsonl(tmp_path / "log.jsonl", [line(session="n", calls=[tool_call("close_ticket", {"ticket_id": 1})])])
    with Store(path) as store:
        run_id, _ = compare_logs(store, log, log, CompareOptions(schema_dir=None))
        assert run_id == 2
        rows = store.query("SELECT finish_reason, length(request_digest) FROM outputs WHERE run_id = 2")[1]
        assert rows == [("tool_calls", 64), ("tool_calls", 64)]


def _version_11_replay(path):
    """A file as toolaudit wrote it before migration 12: a replay whose decoded baseline answered `search` (a
    declared tool: its schema judged it) on three calls and an invented `2025_q4` on one."""

    con = database_at(path, 11, applied_at="TIMESTAMP '2026-01-01'")
    con.execute("""INSERT INTO runs (run_id, name, kind, status, created_at, baseline_name, candidate_name)
                   VALUES (1, 'old', 'replay', 'interrupted', TIMESTAMP '2026-01-02', 'target', 'spec-ngram')""")
    con.execute("SELECT nextval('run_id_seq')")  # as create_run took the id
    for i, (tool, drifted) in enumerate([("search", True), ("search", False), ("search", False), ("2025_q4", True)]):
        con.execute("""INSERT INTO calls (run_id, session_id, call_index, customer, tool_name, match_status,
                       drift_kind, drifted, baseline_valid) VALUES (1, 's', ?, 'acme', ?, 'matched', ?, ?, ?)""",
                    [i, tool, "arguments_changed" if drifted else "identical", drifted, tool == "search" or None])
    con.execute(SESSIONS_SQL, [1, 1])
    con.close()


def test_a_version_11_database_keeps_its_calls_and_its_tools_read_as_before_a_resume_keys_the_rest(tmp_path):
    """Migration 12 adds `calls.recorded_tool`: a file written before it opens (read-only too: it is upgraded
    first) with every row kept and the column NULL, so its per-tool figures read as before (a decoded baseline's
    invented name as `(other)`); a resume of that run writes the column, and its new rows key by the recorded
    call's tool while the old rows keep the fallback; a run created since keys a NULL as no tool call."""
    from toolaudit.analysis.figures import run_summary
    from toolaudit.compare.pairs import write_call
    from toolaudit.store import RowBuffer
    from toolaudit.store.report_queries import tool_rows as report_tool_rows
    from toolaudit.store.vocabulary import DriftKind, MatchStatus

    path = tmp_path / "v11.duckdb"
    _version_11_replay(path)
    with Store(path, read_only=True) as store:
        assert store.schema_version() == MIGRATIONS[-1][0] >= 12
        assert store.query("SELECT count(*), count(recorded_tool), count(tool_name) FROM calls")[1] == [(4, 0, 4)]
        old = run_summary(store, 1)
        assert (old["calls"], old["drifted_calls"], old["tool_key"]) == (4, 2, "declared")
        assert {t["tool_name"]: (t["calls"], t["drifted_calls"]) for t in old["tools"]} == {
            "search": (3, 1), "(other)": (1, 1)}
        assert {t["tool_name"]: t["calls"] for t in report_tool_rows(store, 1, "acme", True)} == {
            "search": 3, "(other)": 1}
    with Store(path) as store:
        # the resume: two more calls, the recorded call's tool written (the decode invented a name on one; the
        # other's recorded response called no tool)
        rows = RowBuffer()
        write_call(rows, 1, "s", 4, MatchStatus.MATCHED, customer="acme", tool_name="sell_304.5",
                   kind=DriftKind.TOOL_NAME_CHANGED, recorded_tool="search")
        write_call(rows, 1, "s", 5, MatchStatus.MATCHED, customer="acme", tool_name="2025_q4",
                   kind=DriftKind.IDENTICAL, recorded_tool=None)
        store.write_rows(rows)
        resumed = run_summary(store, 1)
        assert resumed["tool_key"] == "recorded"
        # call 4 by its recorded tool; the NULLs of a run created before migration 12 fall back (call 5 too)
        assert {t["tool_name"]: (t["calls"], t["drifted_calls"]) for t in resumed["tools"]} == {
            "search": (4, 2), "(other)": (2, 1)}
        # a run created since: the same rows, a NULL is the recorded response's no tool call
        new = store.create_run("replay", "new", "target", "spec-ngram", "t", "t", {})
        store.con.execute("INSERT INTO calls SELECT * REPLACE (? AS run_id) FROM calls WHERE run_id = 1 "
                          "AND (recorded_tool IS NOT NULL OR call_index = 5)", [new])
        assert {t["tool_name"]: t["calls"] for t in run_summary(store, new)["tools"]} == {"search": 1, None: 1}
        assert {t["tool_name"]: t["calls"] for t in report_tool_rows(store, new, "acme", True)} == {
            "search": 1, "(no tool call)": 1}


def _schema(con) -> dict[str, list]:
    """Everything a file's schema holds, as text: tables' columns, views' SQL, indexes, sequences, macros."""
    queries = {
        "columns": "SELECT table_name, column_name, ordinal_position, data_type, is_nullable, column_default "
                   "FROM information_schema.columns ORDER BY ALL",
        "views": "SELECT view_name, sql FROM duckdb_views() WHERE NOT internal ORDER BY ALL",
        "constraints": "SELECT table_name, constraint_type, constraint_text FROM duckdb_constraints() ORDER BY ALL",
        "indexes": "SELECT table_name, index_name, sql FROM duckdb_indexes() ORDER BY ALL",
        "sequences": "SELECT sequence_name, start_value, last_value FROM duckdb_sequences() ORDER BY ALL",
        "macros": "SELECT function_name, macro_definition FROM duckdb_functions() WHERE NOT internal "
                  "AND function_type = 'macro' ORDER BY ALL",
        "versions": "SELECT version, name FROM schema_migrations ORDER BY version",
    }
    return {what: con.execute(sql).fetchall() for what, sql in queries.items()}


def test_a_new_file_has_the_schema_of_every_migration_applied_in_turn(tmp_path):
    """A new file is created in one transaction with each view made once (`migrations.TABLES_ONLY`): the same
    tables, columns, views, indexes, sequences, macros and recorded versions as migrations 1..latest applied one
    by one, as a file that lived through every release has them."""
    import duckdb

    stepwise = database_at(tmp_path / "stepwise.duckdb", MIGRATIONS[-1][0])
    try:
        expected = _schema(stepwise)
    finally:
        stepwise.close()
    with Store(tmp_path / "new.duckdb"):
        pass
    con = duckdb.connect(str(tmp_path / "new.duckdb"), read_only=True)
    try:
        got = _schema(con)
    finally:
        con.close()
    assert got == expected
    assert len(got["views"]) >= len(VIEWS) and got["versions"][-1][0] == MIGRATIONS[-1][0]


def test_every_migration_that_recreates_views_gives_its_tables_alone_for_a_new_file():
    """A migration that re-creates views needs its tables-only form (else a new file would make its views at an
    old definition, then again); the tables-only forms create no view a later migration replaces."""
    from toolaudit.store.migrations import TABLES_ONLY

    recreating = {v for v, _, sql in MIGRATIONS if "CREATE OR REPLACE VIEW" in sql}
    assert recreating == set(TABLES_ONLY)
    assert not any("CREATE OR REPLACE VIEW" in sql for sql in TABLES_ONLY.values())


def test_new_files_come_from_the_template_and_never_clobber(tmp_path, monkeypatch):
    """A new file is the process's template copied and linked into place (`store.template`): its migrations are
    recorded as applied when it was made; a path that appears meanwhile is left alone (the caller migrates what is
    there), and so is everything where the filesystem has no hard links."""
    import os
    import time

    import duckdb

    from toolaudit.store import template

    old = tmp_path / "template" / "old.duckdb"
    old.parent.mkdir()
    template.new_schema_file(str(old))
    with duckdb.connect(str(old)) as con:
        con.execute("UPDATE schema_migrations SET applied_at = TIMESTAMP '2000-01-01'")
    monkeypatch.setattr(template, "_template", str(old))
    monkeypatch.setattr(template, "_new_files", 1)
    before = time.time()
    with Store(tmp_path / "a.duckdb") as store:
        applied = store.query("SELECT min(epoch(applied_at)) FROM schema_migrations")[1][0][0]
    assert applied >= before - 1  # not the template's own time
    theirs = tmp_path / "theirs.duckdb"
    theirs.write_bytes(b"another process's file")
    assert template.place_new_file(str(theirs)) is False
    assert theirs.read_bytes() == b"another process's file"

    def no_links(src, dst):
        raise OSError("hard links not supported here")

    monkeypatch.setattr(os, "link", no_links)
    assert template.place_new_file(str(tmp_path / "b.duckdb")) is False
    with Store(tmp_path / "b.duckdb") as store:  # migrated in place instead
        assert store.schema_version() == MIGRATIONS[-1][0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.duckdb", "b.duckdb", "template", "theirs.duckdb"]
    monkeypatch.setattr(template, "_template", None)  # no temporary folder to make the template in
    monkeypatch.setattr(template, "_new_files", 1)
    monkeypatch.setattr(template.tempfile, "mkdtemp", lambda **_: (_ for _ in ()).throw(OSError("read-only")))
    with Store(tmp_path / "c.duckdb") as store:
        assert store.schema_version() == MIGRATIONS[-1][0]


def test_a_process_first_new_file_is_migrated_in_place_and_its_second_makes_the_template(tmp_path, monkeypatch):
    """One-file commands (most) make no template: nothing left in the temporary folder when one is killed."""
    from toolaudit.store import template

    monkeypatch.setattr(template, "_template", None)
    monkeypatch.setattr(template, "_new_files", 0)
    monkeypatch.setattr(template.tempfile, "tempdir", str(tmp_path))
    Store(tmp_path / "one.duckdb").close()
    assert template._template is None and not list(tmp_path.glob("toolaudit-template-*"))
    Store(tmp_path / "two.duckdb").close()
    assert template._template and len(list(tmp_path.glob("toolaudit-template-*"))) == 1

