"""Bad input never crashes a run, never drops a line silently and never corrupts the database.

Each case ends either in a clear error naming the file, line and field, or in an error row with the run
completing and every input line accounted for.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner
from conftest import CLOSE_TOOL, line, tool_call, write_jsonl

from toolaudit.cli import cli
from toolaudit.compare import CompareOptions, compare_logs
from toolaudit.errors import StoreError
from toolaudit.store import Store

GOOD = line(session="good", calls=[tool_call("close_ticket", {"ticket_id": 1})])


def compare_with_bad_line(tmp_path, db_path, bad, side="candidate", schema_dir=None):
    """Both logs hold GOOD; `bad` is appended to one side. Returns (store, run_id, counts, error_rows)."""
    b = write_jsonl(tmp_path / "b.jsonl", [GOOD] + ([bad] if side == "baseline" else []))
    c = write_jsonl(tmp_path / "c.jsonl", [GOOD] + ([bad] if side == "candidate" else []))
    store = Store(db_path)
    run_id, counts = compare_logs(store, b, c, CompareOptions(schema_dir=schema_dir))
    errors = store.rows("SELECT * FROM trace_errors WHERE run_id = ?", [run_id])
    assert store.run_row(run_id)["status"] == "complete"
    for stats in (counts.baseline, counts.candidate):  # every line accounted for
        assert stats.lines == stats.blank + stats.calls + stats.errors
    assert counts.matched == 1  # the good line still went through
    return store, run_id, counts, errors


@pytest.mark.parametrize("bad, field, needle", [
    (b"this is not json", None, "not valid JSON"),
    (b"[1, 2, 3]", None, "must be a JSON object, got list"),
    (b'"just a string"', None, "must be a JSON object, got str"),
    (b"42", None, "must be a JSON object, got int"),
    (b'{"response": {}}', "request", "missing"),
    (b'{"request": [], "response": {}}', "request", "must be an object, got list"),
    (b'{"request": {"messages": "hi"}, "response": {}}', "request.messages", "must be a list, got a str"),
    (b'{"request": {}, "response": {}}', "request.messages", "must be a list, got missing"),
    (b'{"request": {"messages": [42]}, "response": {}}', "request.messages[0]", "must be an object"),
    (b'{"request": {"messages": [{"role": "robot", "content": "x"}]}, "response": {}}',
     "request.messages[0].role", "unknown role 'robot'"),
    (b'{"request": {"messages": [{"content": "x"}]}, "response": {}}', "request.messages[0].role",
     "unknown role None"),
    (b'{"request": {"messages": [], "tools": {"a": 1}, "metadata": {"session_id": "x"}}, "response": {}}',
     "request.tools", "must be a list"),
    (b'{"request": {"messages": [], "metadata": {"session_id": "x", "temperature": NaN}}, "response": {}}',
     None, "NaN"),
    (b'{"request": {"messages": [], "metadata": {"session_id": "x"}, "top_p": Infinity}, "response": {}}',
     None, "Infinity"),
    (b'{"request": {"messages": [], "metadata": {"session_id": "caf\xe9"}}, "response": {}}', None,
     "invalid UTF-8"),
    (b'{"request": {"messages": [], "metadata": {}}, "response": {}}', "request.metadata.session_id",
     "--session-key"),
    (b'{"request": {"messages": [], "metadata": {"session_id": "x", "call_index": "first"}}, "response": {}}',
     "request.metadata.call_index", "non-negative integer"),
    (b'{"request": {"messages": [], "metadata": {"session_id": "x"}}}', "response", "missing"),
    (b'{"request": {"messages": [], "metadata": {"session_id": "x"}}, "response": "ok"}', "response",
     "must be an object"),
    (b'{"request": {"messages": [', None, "not valid JSON"),
])
@pytest.mark.parametrize("side", ["baseline", "candidate"])
def test_bad_line_becomes_error_row(tmp_path, db_path, bad, field, needle, side):
    store, run_id, counts, errors = compare_with_bad_line(tmp_path, db_path, bad, side=side)
    assert len(errors) == 1
    err = errors[0]
    assert err["side"] == side and err["line"] == 2 and err["source"].endswith(f"{side[0]}.jsonl")
    assert err["field"] == field
    assert needle in err["message"], err["message"]
    assert getattr(counts, side).errors == 1


def test_duplicate_call_index_is_an_error_row_naming_the_first(tmp_path, db_path):
    dup = line(session="good", call_index=0, calls=[tool_call("close_ticket", {"ticket_id": 2})])
    store, run_id, counts, errors = compare_with_bad_line(tmp_path, db_path, dup)
    assert errors[0]["field"] == "request.metadata.call_index"
    assert "duplicate call index 0 for session 'good' (first seen at line 1)" in errors[0]["message"]


def test_arguments_not_json_is_an_unparseable_outcome(tmp_path, db_path):
    bad = line(session="s", calls=[tool_call("close_ticket", '{"ticket_id": 4')])
    good = line(session="s", calls=[tool_call("close_ticket", {"ticket_id": 4})])
    b = write_jsonl(tmp_path / "b.jsonl", [good])
    c = write_jsonl(tmp_path / "c.jsonl", [bad])
    store = Store(db_path)
    run_id, _ = compare_logs(store, b, c, CompareOptions(schema_dir=None))
    row = store.rows("SELECT * FROM calls")[0]
    assert row["drift_kind"] == "unparseable" and "not valid JSON" in row["detail"]
    out = store.rows("SELECT * FROM outputs WHERE side = 'candidate'")[0]
    assert '{"ticket_id": 4' in out["text"]  # raw text kept


@pytest.mark.parametrize("args, needle", [("[1, 2]", "must be a JSON object"), ("7", "must be a JSON object"),
                                          ('{"ticket_id": NaN}', "NaN")])
def test_arguments_json_but_not_object_or_nan(tmp_path, db_path, args, needle):
    good = line(session="s", calls=[tool_call("close_ticket", {"ticket_id": 4})])
    bad = line(session="s", calls=[tool_call("close_ticket", args)])
    store = Store(db_path)
    compare_logs(store, write_jsonl(tmp_path / "b.jsonl", [good]), write_jsonl(tmp_path / "c.jsonl", [bad]),
                 CompareOptions(schema_dir=None))
    row = store.rows("SELECT * FROM calls")[0]
    assert row["drift_kind"] == "unparseable" and needle in row["detail"]


def test_five_megabyte_argument_is_kept_whole(tmp_path, db_path):
    big = "x" * (5 * 1024 * 1024)
    rec_b = line(session="s", calls=[tool_call("search_tickets", {"query": big})])
    rec_c = line(session="s", calls=[tool_call("search_tickets", {"query": big + "y"})])
    store = Store(db_path)
    compare_logs(store, write_jsonl(tmp_path / "b.jsonl", [rec_b]), write_jsonl(tmp_path / "c.jsonl", [rec_c]),
                 CompareOptions(schema_dir=None))
    assert store.rows("SELECT drift_kind FROM calls")[0]["drift_kind"] == "arguments_changed"
    length = store.query("SELECT length(text) FROM outputs WHERE side = 'baseline'")[1][0][0]
    assert length > 5 * 1024 * 1024


def test_invalid_tool_schema_is_reported_by_name_and_calls_still_diffed(tmp_path, db_path):
    broken = {"type": "function", "function": {"name": "close_ticket",
                                               "parameters": {"type": "objekt", "properties": {}}}}
    b = line(session="s", tools=[broken], calls=[tool_call("close_ticket", {"ticket_id": 4})])
    c = line(session="s", tools=[broken], calls=[tool_call("close_ticket", {"ticket_id": 5})])
    store = Store(db_path)
    run_id, _ = compare_logs(store, write_jsonl(tmp_path / "b.jsonl", [b]), write_jsonl(tmp_path / "c.jsonl", [c]),
                             CompareOptions(schema_dir=None))
    issues = store.rows("SELECT * FROM schema_issues WHERE run_id = ?", [run_id])
    assert [(i["tool_name"], i["severity"]) for i in issues] == [("close_ticket", "invalid")]
    row = store.rows("SELECT * FROM calls")[0]
    assert row["drift_kind"] == "arguments_changed" and row["baseline_valid"] is None


def test_schema_override_file_not_json_names_file_and_line(tmp_path, db_path):
    schemas = tmp_path / "schemas"
    schemas.mkdir()
    (schemas / "close_ticket.json").write_text('{\n  "type": "object",\n  "properties": {,\n}')
    runner = CliRunner()
    b = write_jsonl(tmp_path / "b.jsonl", [GOOD])
    result = runner.invoke(cli, ["compare", str(b), str(b), "--db", str(db_path), "--schemas", str(schemas)])
    assert result.exit_code == 1
    assert "close_ticket.json:3" in result.output and "not valid JSON" in result.output


@pytest.mark.parametrize("content", [b"", b"\n\n  \n"])
def test_empty_file_is_a_clear_error(tmp_path, db_path, content):
    (tmp_path / "empty.jsonl").write_bytes(content)
    good = write_jsonl(tmp_path / "good.jsonl", [GOOD])
    result = CliRunner().invoke(cli, ["compare", str(good), str(tmp_path / "empty.jsonl"), "--db", str(db_path)])
    assert result.exit_code == 1
    assert f"Error: {tmp_path / 'empty.jsonl'}: file is empty" in result.output
    with Store(db_path, read_only=True) as store:  # the database is intact and says what happened
        assert store.rows("SELECT status FROM runs")[0]["status"] == "interrupted"


def test_missing_trace_file_is_a_clear_error(tmp_path, db_path):
    good = write_jsonl(tmp_path / "good.jsonl", [GOOD])
    result = CliRunner().invoke(cli, ["compare", str(good), str(tmp_path / "nope.jsonl"), "--db", str(db_path)])
    assert result.exit_code == 1 and "nope.jsonl: cannot open trace file" in result.output


def test_session_in_one_log_only(tmp_path, db_path):
    only = line(session="lonely", calls=[tool_call("close_ticket", {"ticket_id": 9})])
    store, run_id, counts, errors = compare_with_bad_line(tmp_path, db_path, only, side="baseline")
    assert errors == [] and counts.baseline_only == 1 and counts.drifted == 0


def test_database_file_that_is_not_duckdb(tmp_path):
    fake = tmp_path / "fake.duckdb"
    fake.write_bytes(b"SQLite format 3\x00" + b"\x00" * 4096)
    with pytest.raises(StoreError, match="not a DuckDB database file"):
        Store(fake)
    result = CliRunner().invoke(cli, ["runs", "--db", str(fake)])
    assert result.exit_code == 1 and "fake.duckdb: not a DuckDB database file" in result.output
    assert fake.read_bytes().startswith(b"SQLite format 3")  # untouched


def test_database_locked_by_another_writer(tmp_path, db_path):
    Store(db_path).close()
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import duckdb, sys, time
        con = duckdb.connect({str(db_path)!r})
        print("locked", flush=True)
        time.sleep(30)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(StoreError, match="locked by another writer"):
            Store(db_path)
        good = write_jsonl(tmp_path / "good.jsonl", [GOOD])
        result = CliRunner().invoke(cli, ["compare", str(good), str(good), "--db", str(db_path)])
        assert result.exit_code == 1 and "database is locked by another writer" in result.output
    finally:
        holder.kill()
        holder.wait()
    with Store(db_path) as store:  # usable again once the writer is gone
        assert store.schema_version() >= 1


def test_custom_session_and_customer_keys(tmp_path, db_path):
    recs = []
    for i in range(3):
        rec = line(session="ignored", calls=[tool_call("close_ticket", {"ticket_id": i})])
        rec["session_id"] = "top-level"
        rec["request"]["user"] = f"user-{i % 2}"
        recs.append(rec)
    b = write_jsonl(tmp_path / "b.jsonl", recs)
    store = Store(db_path)
    run_id, counts = compare_logs(store, b, b, CompareOptions(schema_dir=None, session_key="session_id",
                                                              customer_key="request.user"))
    rows = store.rows("SELECT session_id, call_index, customer FROM calls ORDER BY call_index")
    assert [(r["session_id"], r["call_index"], r["customer"]) for r in rows] == [
        ("top-level", 0, "user-0"), ("top-level", 1, "user-1"), ("top-level", 2, "user-0")]


def test_failure_mid_run_leaves_database_consistent(tmp_path, db_path, monkeypatch):
    recs = [line(session=f"s{i}", calls=[tool_call("close_ticket", {"ticket_id": i})]) for i in range(50)]
    b = write_jsonl(tmp_path / "b.jsonl", recs)
    store = Store(db_path)
    first_run, _ = compare_logs(store, b, b, CompareOptions(schema_dir=None))
    import toolaudit.compare as compare

    calls = {"n": 0}
    original = compare._Comparison._candidate

    def exploding(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 30:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(compare._Comparison, "_candidate", exploding)
    with pytest.raises(KeyboardInterrupt):
        compare_logs(store, b, b, CompareOptions(schema_dir=None, batch_rows=10))
    statuses = dict(store.query("SELECT run_id, status FROM runs")[1])
    assert statuses[first_run] == "complete" and statuses[first_run + 1] == "interrupted"
    assert store.query("SELECT count(*) FROM calls WHERE run_id = ?", [first_run])[1][0][0] == 50
    # the interrupted run holds only whole batches, each call once
    n, distinct = store.query("SELECT count(*), count(DISTINCT session_id) FROM calls WHERE run_id = ?",
                              [first_run + 1])[1][0]
    assert n == distinct and n % 10 == 0


def test_sql_is_read_only(tmp_path, db_path):
    good = write_jsonl(tmp_path / "good.jsonl", [GOOD])
    runner = CliRunner()
    assert runner.invoke(cli, ["compare", str(good), str(good), "--db", str(db_path)]).exit_code == 0
    result = runner.invoke(cli, ["sql", "DELETE FROM calls", "--db", str(db_path)])
    assert result.exit_code == 1 and "SQL error" in result.output and "read-only" in result.output
    result = runner.invoke(cli, ["sql", "SELECT count(*) AS n FROM calls", "--db", str(db_path), "--json"])
    assert json.loads(result.output) == [{"n": 1}]


def test_unknown_tool_name_is_diffed_without_schema(tmp_path, db_path):
    b = line(session="s", tools=[CLOSE_TOOL], calls=[tool_call("delete_everything", {"really": True})])
    store, run_id, counts, errors = compare_with_bad_line(tmp_path, db_path, b, side="baseline")
    assert counts.baseline_only == 1
