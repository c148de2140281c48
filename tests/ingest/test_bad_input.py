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

from toolaudit import StoreError
from toolaudit.cli import cli
from toolaudit.compare.logs import CompareOptions, compare_logs
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
     "request.metadata.call_index", "integer from 0 to 2147483647"),
    (b'{"request": {"messages": [], "metadata": {"session_id": "x", "call_index": 12345678901234567890}}, '
     b'"response": {}}', "request.metadata.call_index", "integer from 0 to 2147483647"),  # past BIGINT
    (b'{"request": {"messages": [], "metadata": {"session_id": "x", "call_index": 3000000000}}, '
     b'"response": {}}', "request.metadata.call_index", "integer from 0 to 2147483647"),  # past INTEGER
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
    assert not db_path.exists()  # nothing was compared: no run of 0 calls, so no database either


def test_missing_trace_file_is_a_clear_error(tmp_path, db_path):
    good = write_jsonl(tmp_path / "good.jsonl", [GOOD])
    result = CliRunner().invoke(cli, ["compare", str(good), str(tmp_path / "nope.jsonl"), "--db", str(db_path)])
    assert result.exit_code == 2 and "nope.jsonl: cannot open trace file" in result.output  # a usage error


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
        import duckdb, sys
        con = duckdb.connect({str(db_path)!r})
        print("locked", flush=True)
        sys.stdin.read()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(StoreError, match="locked by another writer"):
            Store(db_path)
        good = write_jsonl(tmp_path / "good.jsonl", [GOOD])
        result = CliRunner().invoke(cli, ["compare", str(good), str(good), "--db", str(db_path)])
        assert result.exit_code == 1 and "database is locked by another writer" in result.output
        assert "wait for it to finish, or use another --db" in result.output and "snapshot" not in result.output
        # a reader opens the writer's snapshot (tests/store/test_readers_during_run.py); this holder publishes
        # none, so the reader is told so
        read = CliRunner().invoke(cli, ["summary", "--db", str(db_path)])
        assert read.exit_code == 1 and "locked by another writer" in read.output
        assert "no snapshot of it for readers is published yet" in read.output
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


# ---------------------------------------------------------------- hostile input never stalls a run

def _pattern_tool(pattern: str, where: str = "pattern") -> dict:
    prop = {"type": "string", "pattern": pattern} if where == "pattern" else {"type": "string"}
    params = {"type": "object", "properties": {"code": prop}, "required": ["code"]}
    if where == "patternProperties":
        params = {"type": "object", "patternProperties": {pattern: {"type": "string"}},
                  "additionalProperties": False}
    return {"type": "function", "function": {"name": "set_code", "parameters": params}}


@pytest.mark.parametrize("where", ["pattern", "patternProperties"])
def test_redos_pattern_finishes_in_seconds(tmp_path, db_path, where):
    """`(a+)+$` against forty `a`s and a `!`: hours in Python's backtracking `re`, milliseconds here."""
    import time

    hostile = "a" * 40 + "!"
    args = {"code": hostile} if where == "pattern" else {hostile: "x"}
    rec = line(session="s", tools=[_pattern_tool("(a+)+$", where)], calls=[tool_call("set_code", args)])
    started = time.monotonic()
    store = Store(db_path)
    run_id, counts = compare_logs(store, write_jsonl(tmp_path / "b.jsonl", [rec]),
                                  write_jsonl(tmp_path / "c.jsonl", [rec]), CompareOptions(schema_dir=None))
    assert time.monotonic() - started < 60  # ~0.3 s here; backtracking or quadratic scans take hours
    row = store.rows("SELECT * FROM calls WHERE run_id = ?", [run_id])[0]
    assert row["drift_kind"] == "identical" and row["baseline_valid"] is False  # it does not match: invalid


def test_pattern_out_of_budget_is_a_schema_issue_and_stops_costing_time(tmp_path, db_path):
    """A pattern the time-boxed matcher cannot finish either: each call gets the budget, validity is unknown,
    a `timeout` schema issue says why, and after three timeouts the schema is not used again."""
    import time

    tools = [_pattern_tool("(x+x+)+y")]
    recs = [line(session=f"s{i}", tools=tools, calls=[tool_call("set_code", {"code": "x" * (5000 + i)})])
            for i in range(8)]
    started = time.monotonic()
    store = Store(db_path)
    run_id, counts = compare_logs(store, write_jsonl(tmp_path / "b.jsonl", recs),
                                  write_jsonl(tmp_path / "c.jsonl", recs), CompareOptions(schema_dir=None))
    assert time.monotonic() - started < 20
    assert counts.matched == 8
    assert {r["baseline_valid"] for r in store.rows("SELECT baseline_valid FROM calls")} == {None}
    issues = store.rows("SELECT * FROM schema_issues WHERE run_id = ? AND severity = 'timeout'", [run_id])
    assert issues and all(i["tool_name"] == "set_code" for i in issues)
    assert "did not finish within the 0.5 s validation budget" in issues[0]["message"]
    assert any("not used again" in i["message"] for i in issues)


DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("where", ["line", "arguments", "content", "string value"])
def test_hundred_thousand_deep_brackets(tmp_path, db_path, where):
    good = line(session="s", calls=[tool_call("search_tickets", {"query": "x"})])
    if where == "line":
        bad = DEEP
    elif where == "arguments":
        bad = line(session="s", calls=[tool_call("search_tickets", DEEP)])
    elif where == "content":
        bad = line(session="s", content=DEEP)
    else:
        bad = line(session="s", calls=[tool_call("search_tickets", {"query": DEEP})])
    store = Store(db_path)
    run_id, counts = compare_logs(store, write_jsonl(tmp_path / "b.jsonl", [good, GOOD]),
                                  write_jsonl(tmp_path / "c.jsonl", [bad, GOOD]), CompareOptions(schema_dir=None))
    kinds = dict(store.query("SELECT session_id, coalesce(drift_kind, match_status) FROM calls")[1])
    if where == "line":
        (err,) = store.rows("SELECT * FROM trace_errors")
        assert err["line"] == 1 and "nested too deeply" in err["message"]
        assert kinds["s"] == "baseline_only"
    else:
        assert kinds["s"] == ("arguments_changed" if where == "string value" else "unparseable")
    assert kinds["good"] == "identical"


def test_valid_arguments_nested_900_deep_are_diffed(tmp_path, db_path):
    """Deeper than DeepDiff, orjson's encoder (254) and repr can go: diffed by top-level argument instead."""
    def rec(leaf: str) -> str:
        text = json.dumps(line(session="s", calls=[tool_call("search_tickets", {"query": "q", "filters": 0})]))
        return text.replace('\\"filters\\": 0', '\\"filters\\": ' + "[" * 900 + leaf + "]" * 900)

    store = Store(db_path)
    compare_logs(store, write_jsonl(tmp_path / "b.jsonl", [rec("1")]), write_jsonl(tmp_path / "c.jsonl", [rec("2")]),
                 CompareOptions(schema_dir=None))
    assert store.rows("SELECT drift_kind FROM calls")[0]["drift_kind"] == "arguments_changed"
    assert [d["arg_path"] for d in store.rows("SELECT arg_path FROM arg_diffs")] == ["filters"]


def test_binary_file_is_an_error_naming_the_file_and_its_first_bad_lines(tmp_path, db_path):
    import random

    binary = tmp_path / "model.bin"
    binary.write_bytes(bytes(random.Random(1).randrange(256) for _ in range(20_000)))
    good = write_jsonl(tmp_path / "good.jsonl", [GOOD])
    result = CliRunner().invoke(cli, ["compare", str(good), str(binary), "--db", str(db_path)])
    assert result.exit_code == 1
    assert f"Error: {binary}: no usable calls: every record failed (" in result.output
    assert "first: line 1: " in result.output and "Read as openai (detected" in result.output


def test_openai_file_whose_every_line_failed_is_an_error(tmp_path, db_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", [b"{", b'{"request": {"messages": "no"}}', b"[]"])
    good = write_jsonl(tmp_path / "good.jsonl", [GOOD])
    result = CliRunner().invoke(cli, ["compare", str(bad), str(good), "--db", str(db_path)])
    assert result.exit_code == 1
    assert "every record failed (3 error rows; first: line 1: not valid JSON" in result.output
    assert "line 2: request.messages: must be a list, got a str" in result.output


def test_file_mixing_formats_names_the_odd_lines(tmp_path, db_path):
    otlp_line = {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "t", "spanId": "s", "attributes": [
        {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}}]}]}]}]}
    responses_line = {"request": {"input": "hi", "metadata": {"session_id": "r"}}, "response": {"output": []}}
    store, run_id, counts, errors = compare_with_bad_line(tmp_path, db_path, otlp_line)
    assert "looks like an OTel GenAI (OTLP/JSON) export, but the file is read as openai" in errors[0]["message"]
    store.close()
    db_path.unlink()
    store, run_id, counts, errors = compare_with_bad_line(tmp_path, db_path, responses_line)
    assert errors[0]["field"] == "request.messages" and "looks like a Responses API log line" in errors[0]["message"]


def test_unclosed_code_fence_before_a_million_spaces_parses_in_linear_time(tmp_path, db_path):
    import time

    hostile = "Sure: ```json" + " " * 1_000_000 + "{"
    good = line(session="s", calls=[tool_call("search_tickets", {"query": "x"})])
    started = time.monotonic()
    store = Store(db_path)
    compare_logs(store, write_jsonl(tmp_path / "b.jsonl", [good]),
                 write_jsonl(tmp_path / "c.jsonl", [line(session="s", content=hostile)]),
                 CompareOptions(schema_dir=None))
    assert time.monotonic() - started < 60  # ~0.3 s here; backtracking or quadratic scans take hours
    assert store.rows("SELECT drift_kind FROM calls")[0]["drift_kind"] == "call_count_changed"
