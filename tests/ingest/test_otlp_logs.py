"""OTLP/JSON details the instrumentation tests do not reach: the older per-message log events joined to their span,
a file that starts with log records, broken log records and pretty-printed documents as error rows, and ids in
protobuf's base64 form."""

from __future__ import annotations

import json

import pytest
from conftest import write_jsonl
from format_records import kv, otel_span, otlp, value

from toolaudit.ingest.formats.otlp import otlp_id
from toolaudit.ingest.registry import detect_format
from toolaudit.ingest.traces import TraceCall, TraceLineError, TraceStats, read_trace

TRACE, SPAN = "ab" * 16, "cd" * 8


def logs(*records: dict) -> dict:
    return {"resourceLogs": [{"resource": {"attributes": kv({"service.name": "agent"})},
                              "scopeLogs": [{"scope": {"name": "test"}, "logRecords": list(records)}]}]}


def event(name: str, body: dict, time: int, trace: str = TRACE, span: str = SPAN) -> dict:
    return {"timeUnixNano": str(time), "eventName": name, "traceId": trace, "spanId": span, "body": value(body),
            "attributes": kv({"gen_ai.system": "openai"})}


def _bare_span() -> dict:
    return otel_span(SPAN, trace_id=TRACE, **{"gen_ai.system_instructions": None, "gen_ai.input.messages": None,
                                               "gen_ai.output.messages": None, "gen_ai.tool.definitions": None})


MESSAGE_EVENTS = logs(
    event("gen_ai.system.message", {"content": "be brief"}, 1),
    event("gen_ai.user.message", {"content": "close ticket 1"}, 2),
    event("gen_ai.choice", {"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "close_ticket", "arguments": '{"ticket_id": 1}'}}]}}, 3))


@pytest.mark.parametrize("logs_first", [False, True])
def test_per_message_log_events_are_joined_to_their_span(tmp_path, logs_first):
    lines = [MESSAGE_EVENTS, otlp(_bare_span())] if logs_first else [otlp(_bare_span()), MESSAGE_EVENTS]
    path = write_jsonl(tmp_path / "export.jsonl", lines)
    assert detect_format(str(path))[0] == "otel"
    stats = TraceStats()
    (call,) = list(read_trace(path, stats=stats))
    assert isinstance(call, TraceCall)
    assert call.request["messages"] == [{"role": "system", "content": "be brief"},
                                        {"role": "user", "content": "close ticket 1"}]
    assert call.response_message["tool_calls"][0]["function"] == {"name": "close_ticket",
                                                                  "arguments": '{"ticket_id": 1}'}
    assert (stats.records, stats.calls, stats.skipped) == (4, 1, 3)  # each log record is counted, skipped


def test_broken_log_records_are_error_rows(tmp_path):
    broken = logs({"traceId": TRACE, "spanId": SPAN, "attributes": [{"value": {}}]})
    path = write_jsonl(tmp_path / "export.jsonl", [otlp(otel_span()), broken, {"resourceLogs": [{"scopeLogs": 3}]}])
    items = list(read_trace(path))
    errors = sorted((e.line, e.field) for e in items if not isinstance(e, TraceCall))
    assert errors == [(2, "attributes[0]"), (3, "resourceLogs[0].scopeLogs")]
    assert sum(isinstance(i, TraceCall) for i in items) == 1


def test_pretty_printed_documents_one_after_another(tmp_path):
    path = tmp_path / "export.json"
    first = json.dumps(otlp(otel_span("a1", start=1, end=2)), indent=2)
    path.write_text(first + "\n" + json.dumps(otlp(otel_span("a2", start=3, end=4)), indent=2) + "\n")
    assert detect_format(str(path)) == ("otel", 1)
    calls = list(read_trace(path))  # each named by its document's first line
    assert [(c.record, c.line, c.call_index) for c in calls] == [("a1", 1, 0), ("a2", first.count("\n") + 2, 1)]


def test_a_broken_pretty_printed_document_is_an_error_row(tmp_path):
    path = tmp_path / "export.json"
    text = json.dumps(otlp(otel_span("a1")), indent=2)
    path.write_text(text + "\n" + text[: len(text) // 2] + "\n")
    items = list(read_trace(path, fmt="otel"))
    (err,) = [i for i in items if isinstance(i, TraceLineError)]
    assert sum(isinstance(i, TraceCall) for i in items) == 1
    assert err.line == text.count("\n") + 2 and "not valid JSON" in err.message


@pytest.mark.parametrize(("raw", "size", "want"), [
    ("q83vEjRWeJA=", 8, "abcdef1234567890"),
    ("q83vEjRWeJCrze8SNFZ4kA==", 16, "abcdef1234567890abcdef1234567890"),
    ("ABCDEF1234567890", 8, "abcdef1234567890"),
    ("span-1", 8, "span-1"),  # neither: kept
    ("", 8, None),
])
def test_ids_in_base64_become_hex(raw, size, want):
    assert otlp_id(raw, size) == want
