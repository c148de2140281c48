"""OTLP/HTTP trace bodies as OTLP/JSON, the shape every toolaudit reader takes (`ingest/formats/otlp.py`).

A protobuf body is parsed with the official generated classes (opentelemetry-proto, imported on first use so
the rest of toolaudit does not need it) and written as OTLP/JSON: lowerCamelCase keys, enums as integers,
64-bit integers as strings, and trace and span ids as lowercase hex (the OTLP/JSON rule; protobuf's own JSON
mapping would write them as base64). A JSON body is taken as it is, its ids checked and lowercased. Either way
the result is the dict a collector's file exporter writes on one line.
"""

from __future__ import annotations

import base64
import re
from typing import Any

import orjson

from toolaudit import ConfigError

PROTOBUF, JSON = "application/x-protobuf", "application/json"
EXTRA_HINT = "install the collect extra: pip install 'toolaudit[collect]'"
_HEX = {"traceId": 32, "spanId": 16, "parentSpanId": 16}
_HEX_RE = re.compile(r"[0-9a-fA-F]*")


class BadPayload(ValueError):
    """A body that cannot be read as an ExportTraceServiceRequest (answered 400)."""


def proto_classes() -> tuple[Any, Any]:
    """(ExportTraceServiceRequest, ExportTraceServiceResponse); ConfigError naming the extra when missing."""
    try:
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    except ImportError as exc:
        raise ConfigError(f"toolaudit collect needs opentelemetry-proto and protobuf ({exc}); {EXTRA_HINT}"
                          ) from None
    return trace_service_pb2.ExportTraceServiceRequest, trace_service_pb2.ExportTraceServiceResponse


def decode_request(body: bytes, content_type: str) -> dict:
    """The body (already decompressed) as an OTLP/JSON ExportTraceServiceRequest dict; BadPayload if not."""
    if content_type == PROTOBUF:
        return _from_protobuf(body)
    try:
        doc = orjson.loads(body) if body.strip() else {}
    except orjson.JSONDecodeError as exc:
        raise BadPayload(f"the body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadPayload(f"an ExportTraceServiceRequest is a JSON object, got {type(doc).__name__}")
    _check_shape(doc)
    return doc


def _from_protobuf(body: bytes) -> dict:
    from google.protobuf.json_format import MessageToDict
    from google.protobuf.message import DecodeError

    request_class, _ = proto_classes()
    try:
        message = request_class.FromString(body)
    except (DecodeError, ValueError) as exc:
        raise BadPayload(f"the body is not a protobuf ExportTraceServiceRequest: {exc}") from None
    doc = MessageToDict(message, use_integers_for_enums=True)
    for rs in doc.get("resourceSpans", []):
        for scope in rs.get("scopeSpans", []):
            for span in scope.get("spans", []):
                _hex_ids(span)
                for link in span.get("links", []):
                    _hex_ids(link)
    return doc


def _hex_ids(obj: dict) -> None:
    for key in _HEX:
        if key in obj:
            obj[key] = base64.b64decode(obj[key]).hex()


def _check_shape(doc: dict) -> None:
    """The containers a reader walks: lists of objects down to the spans (spans themselves are judged one by
    one, by `span_problem`)."""
    resource_spans = doc.get("resourceSpans", [])
    if not isinstance(resource_spans, list):
        raise BadPayload("resourceSpans must be a list")
    for r, rs in enumerate(resource_spans):
        if not isinstance(rs, dict):
            raise BadPayload(f"resourceSpans[{r}] must be an object")
        scopes = rs.get("scopeSpans", [])
        if not isinstance(scopes, list):
            raise BadPayload(f"resourceSpans[{r}].scopeSpans must be a list")
        for s, scope in enumerate(scopes):
            if not isinstance(scope, dict) or not isinstance(scope.get("spans", []), list):
                raise BadPayload(f"resourceSpans[{r}].scopeSpans[{s}] must be an object with a spans list")


def span_problem(span: Any) -> str | None:
    """Why a span cannot be kept (no usable trace or span id), else None; lowercases its hex ids in place."""
    if not isinstance(span, dict):
        return "a span that is not an object"
    for key, width in _HEX.items():
        value = span.get(key)
        if value in (None, "") and key == "parentSpanId":
            continue
        if not isinstance(value, str) or len(value) != width or not _HEX_RE.fullmatch(value):
            return f"a span without a valid {key} ({width} hex digits)"
        if int(value, 16) == 0:
            return f"a span with an all-zero {key}"
        span[key] = value.lower()
    return None


def export_response(content_type: str, rejected: int = 0, message: str = "") -> bytes:
    """An ExportTraceServiceResponse in the request's encoding; `partial_success` when spans were rejected."""
    if content_type == JSON:
        if not rejected and not message:
            return b"{}"
        return orjson.dumps({"partialSuccess": {"rejectedSpans": str(rejected), "errorMessage": message}})
    _, response_class = proto_classes()
    response = response_class()
    if rejected or message:
        response.partial_success.rejected_spans = rejected
        response.partial_success.error_message = message
    return response.SerializeToString()


def status_body(content_type: str, code: int, message: str) -> bytes:
    """A google.rpc.Status (`code`, `message`) in the request's encoding, as OTLP/HTTP answers failures.

    The protobuf form is written by hand (field 1 varint, field 2 string) so no googleapis package is needed."""
    if content_type != PROTOBUF:
        return orjson.dumps({"code": code, "message": message})
    text = message.encode()
    return b"\x08" + _varint(code) + b"\x12" + _varint(len(text)) + text


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)

