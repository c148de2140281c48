"""Bad records in the other trace formats: each becomes one error row naming the ORIGINAL file, line, span (or
observation) id and attribute; the run completes and every record is accounted for."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from conftest import line, tool_call, write_jsonl
from format_records import (
    generation,
    lf_trace,
    oi_span,
    otel_attrs,
    otel_span,
    otlp,
    responses_record,
    span,
)

from toolaudit.cli import cli
from toolaudit.compare.logs import CompareOptions, compare_logs
from toolaudit.store import Store

GOOD = {
    "otel": otlp(otel_span("good1", session="good")),
    "openinference": otlp(oi_span("good1", session="good")),
    "langfuse": lf_trace("trg", session="good", observations=[generation("good1", "trg")]),
    "responses": responses_record(session="good"),
}


def _otel_without(attr: str, span_id: str = "bad1") -> dict:
    attrs = otel_attrs(session="x")
    del attrs[attr]
    return otlp(span(span_id, attrs))


def _otel_raw_attr(key: str, raw) -> dict:
    sp = otel_span("bad1", session="x")
    sp["attributes"].append({"key": key, "value": raw})
    return otlp(sp)


def _otel_no_span_id() -> dict:
    sp = otel_span("bad1", session="x")
    del sp["spanId"]
    return otlp(sp)


def _oi_gap() -> dict:
    return otlp(oi_span("bad1", session="x", **{"llm.input_messages.1.message.role": None,
                                                  "llm.input_messages.1.message.content": None,
                                                  "llm.input_messages.2.message.role": "user",
                                                  "llm.input_messages.2.message.content": "hi"}))


CASES = [
    # (format, bad record, field, needle, record id named in the message)
    ("otel", otlp(otel_span("bad1", session="x", **{"gen_ai.input.messages": "[{not json"})),
     "gen_ai.input.messages", "not valid JSON", "bad1"),
    ("otel", otlp(otel_span("bad1", session="x", calls=[(None, {"ticket_id": 1})])),
     "gen_ai.output.messages[0].parts[0].name", "needs the tool's name", "bad1"),
    ("otel", otlp(otel_span("bad1", session="x", end=None)), "endTimeUnixNano", "never ended", "bad1"),
    ("otel", otlp(span("bad1", otel_attrs(session="x"), start=None)), "startTimeUnixNano", "missing", "bad1"),
    ("otel", otlp(otel_span("bad1", session="x", start=5, end=3)), "endTimeUnixNano", "ends before it starts",
     "bad1"),
    ("otel", otlp(otel_span("good1", session="good", calls=[("close_ticket", {"ticket_id": 9})])), "spanId",
     "duplicate span id (first at line 1) with different content", "good1"),
    ("otel", line(session="x", calls=[tool_call("close_ticket", {"ticket_id": 1})]), None,
     "this line looks like an OpenAI Chat Completions log line, but the file is read as otel", None),
    ("otel", otlp(otel_span("bad1", session="x", **{"gen_ai.usage.input_tokens": {"intValue": "many"}})),
     "gen_ai.usage.input_tokens", "intValue 'many' is not an integer", "bad1"),
    ("otel", otlp(otel_span("bad1", session="x", **{"gen_ai.input.messages": json.dumps(
        [{"role": "robot", "parts": []}])})), "gen_ai.input.messages[0].role", "unknown role 'robot'", "bad1"),
    ("otel", otlp(otel_span("bad1", session="x", **{"gen_ai.tool.definitions": json.dumps({"a": 1})})),
     "gen_ai.tool.definitions", "must be a list", "bad1"),
    ("otel", _otel_raw_attr("x.flag", "plain"), "x.flag", "must be an OTLP AnyValue object", "bad1"),
    ("otel", _otel_no_span_id(), "spanId", "missing", None),
    ("otel", {"resourceSpans": [42]}, "resourceSpans[0]", "must be an object", None),
    ("otel", b'{"resourceSpans": [{"scopeSpans": [', None, "not valid JSON", None),
    ("otel", _otel_without("gen_ai.output.messages"), "gen_ai.output.messages", "holds no answer", "bad1"),
    ("otel", otlp(otel_span("bad1", session="x", **{"gen_ai.input.messages": "[" * 100_000})),
     "gen_ai.input.messages", "not valid JSON", "bad1"),
    ("otel", b"\x89PNG\x1a\x00\x00\x00\rIHDR\xff\x00", None, "invalid UTF-8", None),
    ("openinference", _oi_gap(), "llm.input_messages.1", "missing while llm.input_messages.2 exists", "bad1"),
    ("openinference", otlp(oi_span("bad1", session="x", name=None)),
     "llm.output_messages.0.message.tool_calls.0.tool_call.function.name", "needs the tool's name", "bad1"),
    ("openinference", otlp(oi_span("bad1", session="x", **{"llm.invocation_parameters": "{temperature: 0"})),
     "llm.invocation_parameters", "not valid JSON", "bad1"),
    ("openinference", otlp(oi_span("bad1", session="x", **{"llm.tools.0.tool.json_schema": "{"})),
     "llm.tools.0.tool.json_schema", "not valid JSON", "bad1"),
    ("openinference", otlp(oi_span("bad1", session="x", **{"llm.output_messages.0.message.role": "robot"})),
     "llm.output_messages.0.message.role", "unknown role 'robot'", "bad1"),
    ("langfuse", lf_trace("tr2", session="x", observations=[generation("bad1", "tr2", start=None)]),
     "startTime", "missing", "bad1"),
    ("langfuse", lf_trace("tr2", session="x", observations=[generation("bad1", "tr2", input=42)]),
     "input", "must be a list of messages", "bad1"),
    ("langfuse", generation("good1", "trg", output="a different answer"), "id",
     "duplicate observation id (first at line 1) with different content", "good1"),
    ("langfuse", lf_trace("tr2", session="x", observations=[generation(
        "bad1", "tr2", output={"role": "assistant", "tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]})]),
     "output.tool_calls[0].function.name", "needs the tool's name", "bad1"),
    ("langfuse", generation("bad1", "tr2", start="yesterday"), "startTime", "not an ISO 8601 time", "bad1"),
    ("langfuse", otlp(otel_span()), None, "looks like an OTel GenAI (OTLP/JSON) export", None),
    ("responses", responses_record(session="x", name=None), "response.output[0].name", "needs the tool's name",
     None),
    ("responses", {**responses_record(session="x"), "response": {"id": "r", "output": {"a": 1}}},
     "response.output", "must be a list", None),
    ("responses", line(session="x"), "request.input", "looks like an OpenAI Chat Completions log line", None),
    ("responses", {"request": {"input": [{"content": "hi"}], "metadata": {"session_id": "x"}}, "response": None},
     "request.input[0].type", "needs a type", None),
    ("responses", responses_record(session="good", call_index=0), "request.metadata.call_index",
     "duplicate call index 0 for session 'good' (first seen at line 1)", None),
    ("responses", {"request": {"input": "hi", "metadata": {}}, "response": {"output": []}},
     "request.metadata.session_id", "--session-key", None),
]


def compare_bad(tmp_path, fmt: str, bad, **options):
    b = write_jsonl(tmp_path / f"b_{fmt}.jsonl", [GOOD[fmt]])
    c = write_jsonl(tmp_path / f"c_{fmt}.jsonl", [GOOD[fmt], bad])
    store = Store(tmp_path / "audit.duckdb")
    run_id, counts = compare_logs(store, b, c, CompareOptions(schema_dir=None, **options))
    errors = store.rows("SELECT * FROM trace_errors WHERE run_id = ?", [run_id])
    assert store.run_row(run_id)["status"] == "complete"
    for stats in (counts.baseline, counts.candidate):
        assert stats.records == stats.calls + stats.errors + stats.skipped
    assert counts.matched == 1
    return store, counts, errors, c


@pytest.mark.parametrize("fmt, bad, field, needle, record", CASES,
                         ids=[f"{c[0]}-{c[2] or 'line'}-{i}" for i, c in enumerate(CASES)])
def test_bad_record_is_one_error_row_naming_file_line_record_and_attribute(tmp_path, fmt, bad, field, needle,
                                                                           record):
    store, counts, errors, candidate = compare_bad(tmp_path, fmt, bad, format=fmt)
    assert len(errors) == 1, errors
    err = errors[0]
    assert (err["side"], err["source"], err["line"], err["field"]) == ("candidate", str(candidate), 2, field)
    assert needle in err["message"], err["message"]
    word = "observation" if fmt == "langfuse" else "span"
    assert (f"{word} {record}: " in err["message"]) == (record is not None), err["message"]
    assert counts.candidate.errors == 1 and len(err["excerpt"]) <= 200


def test_missing_conversation_id_falls_back_to_the_trace_id(tmp_path):
    sp = otel_span("a9", session=None, trace_id="c" * 32)
    store, counts, errors, _ = compare_bad(tmp_path, "otel", otlp(sp))
    assert errors == [] and counts.candidate_only == 1
    assert store.rows("SELECT session_id FROM calls WHERE match_status = 'candidate_only'")[0]["session_id"] == "c" * 32


def test_session_key_attribute_missing_is_an_error_row(tmp_path):
    good = otlp(otel_span("good1", session=None), resource={"tenant.conversation": "good"})
    bad = otlp(otel_span("bad1", session=None, trace_id="b" * 32))  # another trace: nothing to inherit it from
    b = write_jsonl(tmp_path / "b.jsonl", [good])
    c = write_jsonl(tmp_path / "c.jsonl", [good, bad])
    with Store(tmp_path / "a.duckdb") as store:
        run_id, counts = compare_logs(store, b, c, CompareOptions(schema_dir=None, session_key="tenant.conversation"))
        (err,) = store.rows("SELECT * FROM trace_errors WHERE run_id = ?", [run_id])
    assert counts.matched == 1
    assert err["field"] == "tenant.conversation" and "span bad1: missing" in err["message"]


def test_otel_five_megabyte_argument_is_kept_whole(tmp_path):
    big = "x" * (5 * 1024 * 1024)
    b = write_jsonl(tmp_path / "b.jsonl", [otlp(otel_span(calls=[("search_tickets", {"query": big})]))])
    c = write_jsonl(tmp_path / "c.jsonl", [otlp(otel_span(calls=[("search_tickets", {"query": big + "y"})]))])
    with Store(tmp_path / "a.duckdb") as store:
        compare_logs(store, b, c, CompareOptions(schema_dir=None))
        assert store.rows("SELECT drift_kind FROM calls")[0]["drift_kind"] == "arguments_changed"
        assert store.query("SELECT length(text) FROM outputs WHERE side = 'candidate'")[1][0][0] > 5 * 1024 * 1024


def test_a_file_of_only_non_llm_spans_is_an_error(tmp_path, db_path):
    good = write_jsonl(tmp_path / "good.jsonl", [GOOD["otel"]])
    spans = write_jsonl(tmp_path / "spans.jsonl", [otlp(span("h1", {"http.request.method": "GET"}),
                                                        span("t1", {"gen_ai.operation.name": "execute_tool"}))])
    result = CliRunner().invoke(cli, ["compare", str(good), str(spans), "--db", str(db_path)])
    assert result.exit_code == 1
    assert f"{spans}: no usable calls: 2 records skipped as not model calls" in result.output
    assert "gen_ai.operation.name 'execute_tool'" in result.output and "Read as otel (detected" in result.output


def test_an_otel_file_whose_every_record_failed_is_an_error_naming_its_first_bad_lines(tmp_path, db_path):
    good = write_jsonl(tmp_path / "good.jsonl", [GOOD["otel"]])
    bad = write_jsonl(tmp_path / "bad.jsonl", [otlp(otel_span("x1", end=None)), b"{oops",
                                               otlp(otel_span("x2", **{"gen_ai.input.messages": "{"}))])
    result = CliRunner().invoke(cli, ["compare", str(good), str(bad), "--db", str(db_path)])
    assert result.exit_code == 1
    assert f"{bad}: no usable calls: every record failed (3 error rows; first: line 1: endTimeUnixNano: span x1" \
           in result.output
    assert "line 2: not valid JSON" in result.output
    assert not db_path.exists()  # nothing compared: no run, and none of its error rows, are kept


def test_compare_prints_the_first_errors_with_file_line_field_and_the_sql(tmp_path, db_path):
    b = write_jsonl(tmp_path / "b.jsonl", [GOOD["otel"]])
    bad = [otlp(otel_span(f"bad{i}", session="x", **{"gen_ai.input.messages": "["})) for i in range(7)]
    c = write_jsonl(tmp_path / "c.jsonl", [GOOD["otel"], *bad])
    result = CliRunner().invoke(cli, ["compare", str(b), str(c), "--db", str(db_path)])
    assert result.exit_code == 0, result.output
    assert f"    {c}:2: gen_ai.input.messages: span bad0: not valid JSON" in result.output
    assert "... 2 more" in result.output
    assert "all 7: toolaudit sql \"SELECT side, source, line, field, message FROM trace_errors WHERE run_id = 1" \
           in result.output and f"--db {db_path}" in result.output
    summary = CliRunner().invoke(cli, ["summary", "--db", str(db_path)])
    assert f"{c}:8: gen_ai.input.messages" not in summary.output and f"{c}:6:" in summary.output
