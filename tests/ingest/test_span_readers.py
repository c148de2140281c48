"""Phoenix span exports and the Langfuse SDK's spans on small hand-made files: bad records are error rows naming
the line, span and field; another instrumentation's span inside a Langfuse export is read by its convention."""

from __future__ import annotations

import json

from conftest import write_jsonl
from format_records import oi_attrs, otlp, span

from toolaudit.ingest.registry import detect_format
from toolaudit.ingest.traces import TraceCall, read_trace


def phoenix_span(span_id: str = "b1", start: str = "2026-01-01T00:00:01.000001Z",
                 end: str = "2026-01-01T00:00:02Z", **attributes) -> dict:
    flat = {k: v for k, v in oi_attrs().items() if k != "openinference.span.kind"}
    return {"id": "U3Bhbjox", "name": "llm", "context": {"trace_id": "t" * 32, "span_id": span_id},
            "span_kind": "LLM", "parent_id": None, "start_time": start, "end_time": end,
            "status_code": "OK", "status_message": "", "attributes": {**flat, **attributes}, "events": []}


def read(path):
    items = list(read_trace(path, require_response=False))
    return [i for i in items if isinstance(i, TraceCall)], [i for i in items if not isinstance(i, TraceCall)]


def test_phoenix_bad_records_are_error_rows_naming_line_span_and_field(tmp_path):
    good = phoenix_span("b1")
    late = phoenix_span("b2", start="2026-01-01T00:00:03Z", end="2026-01-01T00:00:04+00:00")
    backwards = phoenix_span("b5", start="2026-01-01T00:00:03Z")
    bad_time = phoenix_span("b3", start="yesterday")
    no_ids = {**phoenix_span("b4"), "context": {"trace_id": "t" * 32}}
    conflict = {**phoenix_span("b1"), "name": "other"}
    path = write_jsonl(tmp_path / "p.jsonl", [good, {"data": [late, bad_time], "next_cursor": None}, no_ids,
                                              conflict, {"request": {}, "response": {}}, backwards])
    assert detect_format(str(path)) == ("phoenix", 1)
    calls, errors = read(path)
    assert [(c.record, c.call_index) for c in calls] == [("b1", 0), ("b2", 1)]
    assert calls[0].request["messages"][0]["role"] == "system" and calls[0].customer == "acme"
    assert [(e.line, e.field) for e in errors] == [(2, "start_time"), (3, "context.span_id"),
                                                   (4, "context.span_id"), (5, None), (6, "end_time")]
    assert "span b3" in errors[0].message and "yesterday" in errors[0].message
    assert "looks like" in errors[3].message


def test_an_openinference_span_in_a_langfuse_export_is_read_by_its_convention(tmp_path):
    agent = span("a1", {"langfuse.observation.type": "agent", "session.id": "sess-9", "user.id": "initech"})
    llm = span("b1", oi_attrs(session=None, customer=None), parentSpanId="a1")
    generation = span("g1", {"langfuse.observation.type": "generation", "langfuse.observation.model.name": "m",
                             "langfuse.observation.input": json.dumps({"messages": [{"role": "robot"}]})},
                      start=3, end=4, parentSpanId="a1")
    path = write_jsonl(tmp_path / "l.jsonl", [otlp(agent, llm, generation)])
    assert detect_format(str(path)) == ("langfuse", 1)
    calls, errors = read(path)
    assert [(c.record, c.session_id, c.customer) for c in calls] == [("b1", "sess-9", "initech")]
    assert [(e.line, e.field) for e in errors] == [(1, "langfuse.observation.input.messages[0].role")]
    assert "span g1" in errors[0].message and "robot" in errors[0].message
