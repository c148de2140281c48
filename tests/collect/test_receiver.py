"""`toolaudit collect` for real: a subprocess on a loopback port, spoken to over HTTP in both OTLP encodings.
What it answers must follow the OTLP/HTTP spec (responses in the request's encoding, partial success, 400 /
413 / 415 / 405), and what it stores must be OTLP/JSON with hex ids holding only the model-call spans,
durably: every span acknowledged is on disk after a kill -9."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from toolaudit.collect.files import collected_files
from toolaudit.collect.select import Selection, select_collected

from .support import JSON, PROTOBUF, REPO, CollectProcess, attr, chat_attrs, export, send, span, stored_spans


def proto_request(trace_id: bytes, span_id: bytes, attributes: dict, kind: int = 3) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value="svc")))
    one = rs.scope_spans.add().spans.add()
    one.trace_id, one.span_id, one.name, one.kind = trace_id, span_id, "chat m", kind
    one.start_time_unix_nano, one.end_time_unix_nano = 1_700_000_000_000_000_000, 1_700_000_000_000_001_000
    for key, value in attributes.items():
        one.attributes.append(KeyValue(key=key, value=AnyValue(string_value=value)))
    return request


def test_a_protobuf_body_is_stored_as_otlp_json_with_hex_ids(receiver):
    trace_id, span_id = bytes(range(1, 17)), bytes(range(0xA0, 0xA8))
    body = proto_request(trace_id, span_id, {"gen_ai.operation.name": "chat", "user.id": "acme"})
    http = proto_request(bytes(range(2, 18)), bytes(range(3, 11)), {"http.method": "GET"})
    body.resource_spans[0].scope_spans[0].spans.extend(http.resource_spans[0].scope_spans[0].spans)
    status, headers, answer = send(receiver.url + "/v1/traces", body.SerializeToString(), PROTOBUF)
    assert status == 200 and headers["Content-Type"] == PROTOBUF
    response = ExportTraceServiceResponse.FromString(answer)
    assert not response.HasField("partial_success")
    [stored] = stored_spans(receiver.folder)  # the HTTP span is not a model call: dropped
    assert stored["traceId"] == trace_id.hex() and stored["spanId"] == span_id.hex()
    assert stored["kind"] == 3 and stored["startTimeUnixNano"] == "1700000000000000000"
    assert {a["key"] for a in stored["attributes"]} == {"gen_ai.operation.name", "user.id"}


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_compressed_json_body_on_the_langfuse_path(receiver, encoding):
    one = span(chat_attrs("s1", "acme"), trace_id="AB" * 16)
    body = json.dumps(export(one, span([attr("http.route", "/")]))).encode()
    status, headers, answer = send(receiver.url + "/api/public/otel/v1/traces", body, JSON, encoding=encoding)
    assert (status, headers["Content-Type"], json.loads(answer)) == (200, JSON, {})
    [stored] = stored_spans(receiver.folder)
    assert stored["traceId"] == "ab" * 16  # hex ids are kept lowercase, as the OTLP/JSON spec writes them


def test_spans_without_ids_are_a_partial_success(receiver):
    good = span(chat_attrs("s1", "acme"))
    no_trace = {**span(chat_attrs("s1", "acme")), "traceId": ""}
    bad_span = {**span(chat_attrs("s1", "acme")), "spanId": "xyz"}
    status, _, answer = send(receiver.url + "/v1/traces", json.dumps(export(good, no_trace, bad_span)).encode())
    partial = json.loads(answer)["partialSuccess"]
    assert status == 200 and partial["rejectedSpans"] == "2"
    assert "traceId" in partial["errorMessage"] and "spanId" in partial["errorMessage"]
    assert [s["spanId"] for s in stored_spans(receiver.folder)] == [good["spanId"]]
    # protobuf: a span with no trace id is rejected, and said so in a protobuf response
    body = proto_request(b"", bytes(range(8)), {"gen_ai.operation.name": "chat"})
    status, _, answer = send(receiver.url + "/v1/traces", body.SerializeToString(), PROTOBUF)
    partial = ExportTraceServiceResponse.FromString(answer).partial_success
    assert status == 200 and partial.rejected_spans == 1 and "traceId" in partial.error_message


def test_bad_requests_get_the_spec_answers(tmp_path):
    proc = CollectProcess(tmp_path / "c", tmp_path / "log", "--max-body-bytes", "100000")
    try:
        url = proc.url + "/v1/traces"
        big = json.dumps(export(span(chat_attrs("s", "c", prompt="x" * 120_000)))).encode()
        status, _, answer = send(url, big)
        assert status == 413 and json.loads(answer)["code"] == 8
        # the limit holds for the decompressed body (a small gzip of a big body)
        status, _, _ = send(url, big, encoding="gzip")
        assert status == 413
        status, _, answer = send(url, b"{not json")
        assert status == 400 and json.loads(answer)["code"] == 3 and "not JSON" in json.loads(answer)["message"]
        status, _, answer = send(url, b'{"resourceSpans": {}}')
        assert status == 400 and "resourceSpans must be a list" in json.loads(answer)["message"]
        status, headers, answer = send(url, b"\xff\xff\xff\xff", PROTOBUF)
        assert status == 400 and headers["Content-Type"] == PROTOBUF
        assert answer[:1] == b"\x08" and answer[1] == 3 and b"protobuf" in answer  # google.rpc.Status code 3
        assert send(url, b"{}", "text/plain")[0] == 415
        assert send(url, b"", method="GET")[0] == 405
        assert send(proc.url + "/v1/metrics", b"{}")[0] == 404
        assert not list((tmp_path / "c").glob("traces-*"))  # nothing refused was stored
    finally:
        proc.stop()


def test_no_request_header_is_stored(receiver):
    secret = "sk-live-4f6b1c0ffee"
    headers = {"Authorization": f"Bearer {secret}", "X-Api-Key": secret, "Cookie": f"session={secret}"}
    status, _, _ = send(receiver.url + "/v1/traces", json.dumps(export(span(chat_attrs("s", "c")))).encode(),
                        headers=headers)
    assert status == 200 and stored_spans(receiver.folder)
    assert all(secret.encode() not in p.read_bytes() for p in receiver.folder.iterdir())


def test_every_acknowledged_span_survives_a_kill_9(tmp_path):
    proc = CollectProcess(tmp_path / "c", tmp_path / "log")
    acknowledged = []
    for k in range(30):
        one = span(chat_attrs(f"s{k % 4}", f"cust{k % 2}"))
        if send(proc.url + "/v1/traces", json.dumps(export(one)).encode())[0] == 200:
            acknowledged.append(one["spanId"])
    proc.kill9()  # right after the last 200: no graceful close, no flush at exit
    assert len(acknowledged) == 30
    assert [s["spanId"] for s in stored_spans(tmp_path / "c")] == acknowledged
    # a write killed midway leaves a torn last line: readers pass over it...
    [path] = collected_files(tmp_path / "c")
    with path.open("ab") as handle:
        handle.write(b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "ab')
    selected = select_collected(tmp_path / "c", tmp_path / "sel.jsonl", Selection())
    assert selected.calls == 30 and len(selected.sessions) == 4
    # ...and the receiver cuts it off when it opens the folder again, then appends after it
    proc = CollectProcess(tmp_path / "c", tmp_path / "log2")
    try:
        assert "torn last line" in (tmp_path / "log2").read_text()
        assert send(proc.url + "/v1/traces", json.dumps(export(span(chat_attrs("s9", "c")))).encode())[0] == 200
        assert path.read_bytes().endswith(b"\n") and len(stored_spans(tmp_path / "c")) == 31
    finally:
        proc.stop()


def test_a_second_receiver_on_the_same_folder_is_refused(receiver, tmp_path):
    second = CollectProcess.__new__(CollectProcess)
    with pytest.raises(RuntimeError, match="another toolaudit collect is writing"):
        CollectProcess.__init__(second, receiver.folder, tmp_path / "log2")


BLOCK_PROTO = """
import sys
class NoProto:
    def find_spec(self, name, path=None, target=None):
        if name.startswith("opentelemetry.proto"):
            raise ImportError(f"No module named {name!r}")
sys.meta_path.insert(0, NoProto())
from toolaudit.cli import cli
cli(sys.argv[1:], prog_name="toolaudit")
"""


def test_without_the_extra_collect_names_it(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", BLOCK_PROTO, "collect", "--port", "0", "--dir",
                           str(tmp_path / "c")], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "pip install 'toolaudit[collect]'" in done.stderr
    assert not (tmp_path / "c").exists()  # nothing created before the check
