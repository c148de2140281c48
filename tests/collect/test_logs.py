"""`POST /v1/logs`: GenAI log records (a call's content, as the official OpenAI instrumentation's event mode sends
it) kept beside their spans in the hourly files, in both OTLP encodings; records that are not GenAI content or
name no span dropped, records with broken ids a partial success; and a selection carries the records of the
spans it keeps, so the `otel` reader still joins the content to its call."""

from __future__ import annotations

import json
import secrets

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from toolaudit.collect.files import collected_files
from toolaudit.collect.select import Selection, select_collected
from toolaudit.ingest.traces import TraceCall, read_trace

from .support import JSON, PROTOBUF, attr, export, send, span

DETAILS = "gen_ai.client.inference.operation.details"


def content_attrs(prompt: str) -> list[dict]:
    return [attr("gen_ai.input.messages", [{"role": "user", "parts": [{"type": "text", "content": prompt}]}]),
            attr("gen_ai.output.messages", [{"role": "assistant", "finish_reason": "stop",
                                             "parts": [{"type": "text", "content": f"re: {prompt}"}]}])]


def log_record(trace_id: str, span_id: str, attributes: list[dict], event: str | None = DETAILS) -> dict:
    return {"timeUnixNano": "1700000000000000000", "traceId": trace_id, "spanId": span_id,
            **({"eventName": event} if event else {}), "attributes": attributes}


def log_export(*records: dict) -> dict:
    return {"resourceLogs": [{"resource": {"attributes": [attr("service.name", "svc")]},
                              "scopeLogs": [{"scope": {"name": "openai"}, "logRecords": list(records)}]}]}


def stored(folder, kind: str) -> list[dict]:
    return [json.loads(line) for p in collected_files(folder) for line in p.read_text().splitlines()
            if kind in json.loads(line)]


def chat_span(session: str, customer: str) -> dict:
    """A chat span with its session and customer but no content (the content comes as a log record)."""
    return span([attr("gen_ai.operation.name", "chat"), attr("gen_ai.request.model", "m"),
                 attr("gen_ai.conversation.id", session), attr("user.id", customer)])


def test_json_log_records_are_kept_beside_their_spans_and_joined(receiver):
    one, two = chat_span("s1", "acme"), chat_span("s2", "globex")
    assert send(receiver.url + "/v1/traces", json.dumps(export(one, two)).encode())[0] == 200
    records = [log_record(one["traceId"].upper(), one["spanId"], content_attrs("first")),
               log_record(two["traceId"], two["spanId"], content_attrs("second")),
               log_record(one["traceId"], one["spanId"], [attr("http.status", 200)], event="http.done"),  # not GenAI
               log_record("", "", content_attrs("no span"))]  # names no span: nothing to join it to
    status, headers, answer = send(receiver.url + "/v1/logs", json.dumps(log_export(*records)).encode(),
                                   encoding="gzip")
    assert (status, headers["Content-Type"], json.loads(answer)) == (200, JSON, {})
    [line] = stored(receiver.folder, "resourceLogs")
    kept = line["resourceLogs"][0]["scopeLogs"][0]["logRecords"]
    assert [(r["traceId"], r["spanId"]) for r in kept] == [(one["traceId"], one["spanId"]),
                                                           (two["traceId"], two["spanId"])]  # ids lowercased
    [path] = collected_files(receiver.folder)
    calls = {c.session_id: c for c in read_trace(path) if isinstance(c, TraceCall)}
    assert calls["s1"].request["messages"] == [{"role": "user", "content": "first"}]
    assert calls["s2"].response_message["content"] == "re: second"


def test_protobuf_log_records_with_hex_ids_and_a_body_message(receiver):
    trace_id, span_id = secrets.token_bytes(16), secrets.token_bytes(8)
    request = ExportLogsServiceRequest()
    scope = request.resource_logs.add().scope_logs.add()
    record = scope.log_records.add()  # the older event form: the message in the body, the event name an attribute
    record.trace_id, record.span_id, record.time_unix_nano = trace_id, span_id, 1_700_000_000_000_000_000
    record.attributes.append(KeyValue(key="event.name", value=AnyValue(string_value="gen_ai.user.message")))
    record.body.kvlist_value.values.append(KeyValue(key="content", value=AnyValue(string_value="hi")))
    plain = scope.log_records.add()  # an application log line in the same batch
    plain.trace_id, plain.span_id = trace_id, span_id
    plain.body.string_value = "GET /health 200"
    status, headers, answer = send(receiver.url + "/v1/logs", request.SerializeToString(), PROTOBUF)
    assert status == 200 and headers["Content-Type"] == PROTOBUF
    assert not ExportLogsServiceResponse.FromString(answer).HasField("partial_success")
    [line] = stored(receiver.folder, "resourceLogs")
    [kept] = line["resourceLogs"][0]["scopeLogs"][0]["logRecords"]
    assert (kept["traceId"], kept["spanId"]) == (trace_id.hex(), span_id.hex())
    assert kept["body"] == {"kvlistValue": {"values": [{"key": "content", "value": {"stringValue": "hi"}}]}}


def test_log_records_with_broken_ids_are_a_partial_success(receiver):
    good = log_record(secrets.token_hex(16), secrets.token_hex(8), content_attrs("ok"))
    short = log_record("abc", secrets.token_hex(8), content_attrs("bad"))
    status, _, answer = send(receiver.url + "/v1/logs", json.dumps(log_export(good, short)).encode())
    partial = json.loads(answer)["partialSuccess"]
    assert status == 200 and partial["rejectedLogRecords"] == "1" and "traceId" in partial["errorMessage"]
    request = ExportLogsServiceRequest()
    bad = request.resource_logs.add().scope_logs.add().log_records.add()
    bad.trace_id, bad.span_id, bad.event_name = b"\x01" * 5, b"\x02" * 8, DETAILS
    status, _, answer = send(receiver.url + "/v1/logs", request.SerializeToString(), PROTOBUF)
    partial = ExportLogsServiceResponse.FromString(answer).partial_success
    assert status == 200 and partial.rejected_log_records == 1 and "log record" in partial.error_message
    assert len(stored(receiver.folder, "resourceLogs")) == 1
    status, _, answer = send(receiver.url + "/v1/logs", b'{"resourceLogs": {}}')
    assert status == 400 and json.loads(answer)["code"] == 3


def test_a_selection_keeps_the_log_records_of_its_spans(receiver, tmp_path):
    spans = [chat_span(f"s{k}", "acme") for k in range(6)]
    assert send(receiver.url + "/v1/traces", json.dumps(export(*spans)).encode())[0] == 200
    records = [log_record(s["traceId"], s["spanId"], content_attrs(f"prompt {k}")) for k, s in enumerate(spans)]
    assert send(receiver.url + "/v1/logs", json.dumps(log_export(*records)).encode())[0] == 200
    selected = select_collected(receiver.folder, tmp_path / "sel.jsonl", Selection(since="1h", sample=2))
    assert selected.calls == 2
    lines = [json.loads(line) for line in selected.path.read_text().splitlines()]
    [logs] = [line for line in lines if "resourceLogs" in line]
    chosen = {(s["traceId"], s["spanId"]) for line in lines for rs in line.get("resourceSpans", [])
              for sc in rs["scopeSpans"] for s in sc["spans"]}
    assert {(r["traceId"], r["spanId"]) for r in logs["resourceLogs"][0]["scopeLogs"][0]["logRecords"]} == chosen
    calls = [c for c in read_trace(selected.path) if isinstance(c, TraceCall)]
    assert sorted(c.session_id for c in calls) == sorted(selected.sessions)
    assert all(c.request["messages"][0]["content"] == f"prompt {c.session_id[1:]}" for c in calls)
