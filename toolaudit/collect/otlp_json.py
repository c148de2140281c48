"""OTLP/HTTP trace and log bodies as OTLP/JSON, the shape every toolaudit reader takes (`ingest/formats/otlp.py`,
`ingest/formats/otlp_logs.py`).

A protobuf body is parsed with the official generated classes (opentelemetry-proto, imported on first use so
the rest of toolaudit does not need it) and written as OTLP/JSON: lowerCamelCase keys, enums as integers,
64-bit integers as strings, and trace and span ids as lowercase hex (the OTLP/JSON rule; protobuf's own JSON
mapping would write them as base64). A JSON body is taken as it is, its ids checked and lowercased. Either way
the result is the dict a collector's file exporter writes on one line. Traces and logs differ only in their
container names, their id fields and their proto classes (`Signal`).
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from importlib import import_module
from typing import Any

import orjson

from toolaudit import ConfigError

PROTOBUF, JSON = "application/x-protobuf", "application/json"
EXTRA_HINT = "install the collect extra: pip install 'toolaudit[collect]'"
_HEX_RE = re.compile(r"[0-9a-fA-F]*")


@dataclass(frozen=True)
class Signal:
    """One OTLP signal's request shape: `{resources: [{scopes: [{items: [...]}]}]}`."""

    name: str  # what an item is called in messages: "span", "log record"
    resources: str
    scopes: str
    items: str
    ids: dict[str, tuple[int, bool]]  # id field -> (hex digits, required)
    module: str  # the generated module of its collector service
    request: str
    response: str
    rejected: str  # the partial_success field counting rejected items (protobuf name)


TRACES = Signal("span", "resourceSpans", "scopeSpans", "spans",
                {"traceId": (32, True), "spanId": (16, True), "parentSpanId": (16, False)},
                "opentelemetry.proto.collector.trace.v1.trace_service_pb2", "ExportTraceServiceRequest",
                "ExportTraceServiceResponse", "rejected_spans")
# A log record may name no span (its ids empty): it is judged by `keep`, not rejected; malformed ids are.
LOGS = Signal("log record", "resourceLogs", "scopeLogs", "logRecords",
              {"traceId": (32, False), "spanId": (16, False)},
              "opentelemetry.proto.collector.logs.v1.logs_service_pb2", "ExportLogsServiceRequest",
              "ExportLogsServiceResponse", "rejected_log_records")


class BadPayload(ValueError):
    """A body that cannot be read as the signal's export request (answered 400)."""


def proto_classes(signal: Signal = TRACES) -> tuple[Any, Any]:
    """(export request class, export response class); ConfigError naming the extra when missing."""
    try:
        module = import_module(signal.module)
    except ImportError as exc:
        raise ConfigError(f"toolaudit collect needs opentelemetry-proto and protobuf ({exc}); {EXTRA_HINT}"
                          ) from None
    return getattr(module, signal.request), getattr(module, signal.response)


def decode_request(body: bytes, content_type: str, signal: Signal = TRACES) -> dict:
    """The body (already decompressed) as an OTLP/JSON export request dict; BadPayload if not."""
    if content_type == PROTOBUF:
        return _from_protobuf(body, signal)
    try:
        doc = orjson.loads(body) if body.strip() else {}
    except orjson.JSONDecodeError as exc:
        raise BadPayload(f"the body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadPayload(f"an {signal.request} is a JSON object, got {type(doc).__name__}")
    _check_shape(doc, signal)
    return doc


def _from_protobuf(body: bytes, signal: Signal) -> dict:
    from google.protobuf.json_format import MessageToDict
    from google.protobuf.message import DecodeError

    request_class, _ = proto_classes(signal)
    try:
        message = request_class.FromString(body)
    except (DecodeError, ValueError) as exc:
        raise BadPayload(f"the body is not a protobuf {signal.request}: {exc}") from None
    doc = MessageToDict(message, use_integers_for_enums=True)
    for item in items(doc, signal):
        _hex_ids(item, signal)
        for link in item.get("links", []):
            _hex_ids(link, signal)
    return doc


def items(doc: dict, signal: Signal) -> list:
    """Every span (log record) of a request whose containers `_check_shape` accepted."""
    return [item for rs in doc.get(signal.resources, []) for scope in rs.get(signal.scopes, [])
            for item in scope.get(signal.items, [])]


def _hex_ids(obj: dict, signal: Signal) -> None:
    for key in signal.ids:
        if key in obj:
            obj[key] = base64.b64decode(obj[key]).hex()


def _check_shape(doc: dict, signal: Signal) -> None:
    """The containers a reader walks: lists of objects down to the items (items themselves are judged one by
    one, by `item_problem`)."""
    resources = doc.get(signal.resources, [])
    if not isinstance(resources, list):
        raise BadPayload(f"{signal.resources} must be a list")
    for r, rs in enumerate(resources):
        if not isinstance(rs, dict):
            raise BadPayload(f"{signal.resources}[{r}] must be an object")
        scopes = rs.get(signal.scopes, [])
        if not isinstance(scopes, list):
            raise BadPayload(f"{signal.resources}[{r}].{signal.scopes} must be a list")
        for s, scope in enumerate(scopes):
            if not isinstance(scope, dict) or not isinstance(scope.get(signal.items, []), list):
                raise BadPayload(f"{signal.resources}[{r}].{signal.scopes}[{s}] must be an object with a "
                                 f"{signal.items} list")


def item_problem(item: Any, signal: Signal = TRACES) -> str | None:
    """Why a span or log record cannot be kept (no usable trace or span id), else None; lowercases its hex ids
    in place."""
    if not isinstance(item, dict):
        return f"a {signal.name} that is not an object"
    for key, (width, required) in signal.ids.items():
        value = item.get(key)
        if value in (None, "") and not required:
            continue
        if not isinstance(value, str) or len(value) != width or not _HEX_RE.fullmatch(value):
            return f"a {signal.name} without a valid {key} ({width} hex digits)"
        if int(value, 16) == 0:
            if not required:
                continue  # an all-zero optional id is how protobuf writes "no span"
            return f"a {signal.name} with an all-zero {key}"
        item[key] = value.lower()
    return None


def span_problem(span: Any) -> str | None:
    return item_problem(span, TRACES)


def export_response(content_type: str, rejected: int = 0, message: str = "", signal: Signal = TRACES) -> bytes:
    """The signal's export response in the request's encoding; `partial_success` when items were rejected."""
    if content_type == JSON:
        if not rejected and not message:
            return b"{}"
        field = "".join(w if i == 0 else w.title() for i, w in enumerate(signal.rejected.split("_")))
        return orjson.dumps({"partialSuccess": {field: str(rejected), "errorMessage": message}})
    _, response_class = proto_classes(signal)
    response = response_class()
    if rejected or message:
        setattr(response.partial_success, signal.rejected, rejected)
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

