"""What the collect tests share: a `toolaudit collect` subprocess (tests/helpers.py), OTLP/JSON span
builders, and HTTP posts that keep the status, headers and body of any answer (urllib raises on 4xx)."""

from __future__ import annotations

import gzip
import json
import secrets
import time
import urllib.error
import urllib.request
from pathlib import Path

from helpers import CollectProcess  # noqa: F401  (the collect tests take it from here)

REPO = Path(__file__).resolve().parents[2]
PROTOBUF, JSON = "application/x-protobuf", "application/json"
TOOL = {"type": "function", "name": "search_tickets", "description": "Search support tickets.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}


def send(url: str, body: bytes, content_type: str = JSON, headers: dict | None = None, method: str = "POST",
         encoding: str | None = None) -> tuple[int, dict, bytes]:
    """(status, headers, body) of one request; `encoding` gzip or deflate compresses the body."""
    if encoding == "gzip":
        body = gzip.compress(body)
    elif encoding == "deflate":
        import zlib

        body = zlib.compress(body)
    sent = {"Content-Type": content_type, **({"Content-Encoding": encoding} if encoding else {}), **(headers or {})}
    req = urllib.request.Request(url, data=body if method == "POST" else None, headers=sent, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def attr(key: str, value) -> dict:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    return {"key": key, "value": {"stringValue": value if isinstance(value, str) else json.dumps(value)}}


def chat_attrs(session: str, customer: str, prompt: str = "find open tickets", query: str | None = None
               ) -> list[dict]:
    """The OTel GenAI attributes of one chat call with a tool (what the `otel` reader reads); the recorded
    answer searches for `query` (default: the prompt)."""
    return [attr("gen_ai.operation.name", "chat"), attr("gen_ai.request.model", "m"),
            attr("gen_ai.conversation.id", session), attr("user.id", customer),
            attr("gen_ai.input.messages", [{"role": "user", "parts": [{"type": "text", "content": prompt}]}]),
            attr("gen_ai.output.messages", [{"role": "assistant", "finish_reason": "tool_call", "parts": [
                {"type": "tool_call", "id": "call_1", "name": "search_tickets",
                 "arguments": {"query": query or prompt}}]}]),
            attr("gen_ai.tool.definitions", [TOOL])]


def span(attributes: list[dict], start_ns: int | None = None, trace_id: str | None = None,
         span_id: str | None = None, name: str = "chat m") -> dict:
    start = start_ns if start_ns is not None else time.time_ns()
    return {"traceId": trace_id or secrets.token_hex(16), "spanId": span_id or secrets.token_hex(8), "name": name,
            "kind": 3, "startTimeUnixNano": str(start), "endTimeUnixNano": str(start + 1000),
            "attributes": attributes}


def export(*spans: dict, service: str = "svc") -> dict:
    return {"resourceSpans": [{"resource": {"attributes": [attr("service.name", service)]},
                               "scopeSpans": [{"scope": {"name": "test"}, "spans": list(spans)}]}]}


def stored_spans(folder: Path) -> list[dict]:
    """Every span of every complete line of the collected files."""
    out = []
    for path in sorted(folder.glob("traces-*.jsonl")):
        for line in path.read_bytes().splitlines(keepends=True):
            if line.endswith(b"\n"):
                doc = json.loads(line)
                out += [s for rs in doc["resourceSpans"] for sc in rs["scopeSpans"] for s in sc["spans"]]
    return out


def export_with_sdk(url: str, conversations: dict[str, str], calls: int = 2, service: str = "agent",
                    headers: dict | None = None) -> dict[str, list[tuple[str, str]]]:
    """GenAI chat spans made with the real OpenTelemetry SDK and sent by its real OTLP/HTTP exporter (protobuf,
    gzip): per conversation (id -> customer) an HTTP request span holding `calls` chat spans, and a tool span.
    Returns {conversation: [(trace id, span id) of its chat spans]} as the SDK formats them (hex)."""
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    exporter = OTLPSpanExporter(endpoint=url + "/v1/traces", compression=Compression.Gzip, headers=headers)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    tracer = provider.get_tracer("toolaudit-tests")
    sent: dict[str, list[tuple[str, str]]] = {}
    for conversation, customer in conversations.items():
        with tracer.start_as_current_span("POST /agent") as http:
            http.set_attribute("http.request.method", "POST")
            for k in range(calls):
                with tracer.start_as_current_span("chat m") as chat:
                    for one in chat_attrs(conversation, customer, prompt=f"{conversation} turn {k}"):
                        value = one["value"]
                        chat.set_attribute(one["key"], value.get("stringValue", value.get("intValue")))
                    context = chat.get_span_context()
                    sent.setdefault(conversation, []).append((f"{context.trace_id:032x}", f"{context.span_id:016x}"))
                with tracer.start_as_current_span("execute_tool search_tickets") as tool:
                    tool.set_attribute("gen_ai.operation.name", "execute_tool")
    assert provider.force_flush(30_000), "the exporter did not flush"
    provider.shutdown()
    return sent
