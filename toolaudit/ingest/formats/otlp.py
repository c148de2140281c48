"""OTLP/JSON trace exports (what an OpenTelemetry collector's file exporter or Phoenix writes), shared by the
OTel GenAI and OpenInference readers.

Each line is an `ExportTraceServiceRequest`: `{"resourceSpans": [{"resource": {"attributes": [...]},
"scopeSpans": [{"scope": {...}, "spans": [...]}]}]}`. Attribute values come in any OTLP/JSON form
(`stringValue`, `intValue` as a string or a number, `doubleValue`, `boolValue`, `arrayValue`, `kvlistValue`,
`bytesValue`). This module decodes spans and tells the two conventions apart; `otlp_export` reads a file of
them. Every span is one record: a call, a problem or a skip.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from toolaudit.ingest.formats.base import Call, Invalid, Keys, as_key, get_dotted
from toolaudit.ingest.formats.contract import Sample

# A convention's reader: a decoded span -> a call, or the reason it is skipped. Raises Invalid.
SpanReader = Callable[["Span", Keys], "Call | str"]


@dataclass
class Span:
    line: int
    position: int  # order of the span in the file (ties in start time keep file order)
    span_id: str
    trace_id: str
    name: str
    start: int | None
    end: int | None
    attributes: dict[str, Any]
    resource: dict[str, Any]
    events: list[dict] = field(default_factory=list)  # {"name", "time", "attributes"}
    parent_id: str | None = None  # the parent span's id (None for a root span)

    def attr(self, key: str) -> Any:
        """A span attribute, else the resource's."""
        value = self.attributes.get(key)
        return self.resource.get(key) if value is None else value

    def lookup(self, key: str) -> Any:
        """`attr(key)`, else a dotted path into an attribute that holds a JSON object or a key-value list:
        OpenInference's `using_metadata` writes `metadata` as a JSON string, so `metadata.customer` is a key
        inside it. The longest attribute name that exists wins."""
        value = self.attr(key)
        if value is not None or "." not in key:
            return value
        parts = key.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            head = self.attr(".".join(parts[:cut]))
            if head is None:
                continue
            if isinstance(head, str):
                try:
                    head = json.loads(head)
                except ValueError:
                    return None
            return get_dotted(head, ".".join(parts[cut:]))
        return None

    def where(self, key: str) -> str:
        return key if key in self.attributes or key not in self.resource else f"resource.{key}"

    def session(self, keys: Keys, default_attrs: str | tuple[str, ...]) -> str | None:
        """The session on the span or its resource: `--session-key`'s attribute, else the first of `default_attrs`
        present; None when there is none (settling then takes it from the span's parents or its trace, else the
        trace id: see `otlp_export`)."""
        return self._first(keys.session, default_attrs)

    def customer(self, keys: Keys, default_attrs: str | tuple[str, ...]) -> str | None:
        """The customer on the span or its resource, as `session` finds the session."""
        return self._first(keys.customer, default_attrs)

    def _first(self, named: str | None, default_attrs: str | tuple[str, ...]) -> str | None:
        if named is not None:
            return as_key(self.lookup(named))
        for key in (default_attrs,) if isinstance(default_attrs, str) else default_attrs:
            value = as_key(self.attr(key))
            if value is not None:
                return value
        return None

    def order(self) -> tuple:
        return (self.start, self.line, self.position)

    def check_times(self) -> None:
        if self.start is None:
            raise Invalid("startTimeUnixNano", "missing: the call cannot be placed in its session's order")
        if self.end is None:
            raise Invalid("endTimeUnixNano", "missing: the span never ended (the call did not finish, or the "
                                             "export is truncated)")
        if self.end < self.start:
            raise Invalid("endTimeUnixNano", f"ends before it starts ({self.end} < {self.start})")


def any_value(value: Any, where: str) -> Any:
    """An OTLP/JSON AnyValue as a Python value."""
    if not isinstance(value, dict):
        raise Invalid(where, f"must be an OTLP AnyValue object, got {type(value).__name__}")
    if not value:
        return None
    if len(value) > 1:  # a protobuf oneof: which of two kinds was meant is a guess, so it is not made
        raise Invalid(where, f"an AnyValue holds one kind, got {len(value)}: {sorted(value)[:3]}")
    if "stringValue" in value:
        if not isinstance(value["stringValue"], str):
            raise Invalid(where, "stringValue must be a string")
        return value["stringValue"]
    if "boolValue" in value:
        if not isinstance(value["boolValue"], bool):
            raise Invalid(where, "boolValue must be true or false")
        return value["boolValue"]
    if "intValue" in value:
        return _int(value["intValue"], where, "intValue")
    if "doubleValue" in value:
        return _double(value["doubleValue"], where)
    if "arrayValue" in value:
        items = (value["arrayValue"] or {}).get("values") or [] if isinstance(value["arrayValue"], dict) else None
        if not isinstance(items, list):
            raise Invalid(where, "arrayValue must be {\"values\": [...]}")
        return [any_value(v, f"{where}[{i}]") for i, v in enumerate(items)]
    if "kvlistValue" in value:
        kv = value["kvlistValue"]
        items = (kv or {}).get("values") or [] if isinstance(kv, dict) else None
        if not isinstance(items, list):
            raise Invalid(where, "kvlistValue must be {\"values\": [...]}")
        return key_values(items, where)
    if "bytesValue" in value:
        return value["bytesValue"]
    raise Invalid(where, f"unknown AnyValue kind {sorted(value)[:3]}")


def _int(raw: Any, where: str, kind: str) -> int:
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lstrip("-").isdigit():
        return int(raw)
    raise Invalid(where, f"{kind} {raw!r} is not an integer")


def _double(raw: Any, where: str) -> float:
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return float(raw)
    if isinstance(raw, str):
        try:
            number = float(raw)
        except ValueError:
            pass
        else:
            if math.isfinite(number) or raw.strip() in ("NaN", "Infinity", "-Infinity"):
                return number
    raise Invalid(where, f"doubleValue {raw!r} is not a number")


def key_values(items: Any, where: str) -> dict[str, Any]:
    """`[{"key": k, "value": AnyValue}, ...]` -> {k: value}. A repeated key keeps the last value (as SDKs do)."""
    if items is None:
        return {}
    if not isinstance(items, list):
        raise Invalid(where, f"must be a list of {{key, value}} objects, got {type(items).__name__}")
    out: dict[str, Any] = {}
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("key"), str):
            raise Invalid(f"{where}[{i}]", "must be an object with a string key")
        out[item["key"]] = any_value(item.get("value", {}), item["key"])
    return out


def _nanos(raw: Any, where: str) -> int | None:
    if raw in (None, "", 0, "0"):
        return None
    return _int(raw, where, "time")


def otlp_id(raw: Any, size: int) -> str | None:
    """A trace (16 bytes) or span (8 bytes) id as lowercase hex. OTLP/JSON writes ids as hex; protobuf's JSON
    mapping (`MessageToJson` of an export request) writes bytes as base64, 24 or 12 characters ending in `=`:
    both name the same span, so both become hex. Anything else is kept as it is."""
    if not isinstance(raw, str) or not raw:
        return None
    if len(raw) == 2 * size and _is_hex(raw):
        return raw.lower()
    if len(raw) == 4 * ((size + 2) // 3) and raw.endswith("="):
        try:
            decoded = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            return raw
        if len(decoded) == size:
            return decoded.hex()
    return raw


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdefABCDEF" for c in text)


def _bad_id(raw: Any, what: str) -> str:
    """Why an id was refused: absent, or there but not an id (a number, a word) - said apart, so a user looks for
    the right fault."""
    if raw is None or raw == "":
        return f"missing: every span needs {what}"
    shown = repr(raw)[:40] if isinstance(raw, (str, int, float, bool)) else type(raw).__name__
    return f"must be a string (hex or base64), got {shown}"


def decode_span(raw: dict, resource: dict[str, Any], line: int, position: int) -> Span:
    span_id, trace_id = otlp_id(raw.get("spanId"), 8), otlp_id(raw.get("traceId"), 16)
    if span_id is None:
        raise Invalid("spanId", _bad_id(raw.get("spanId"), "an id"))
    if trace_id is None:
        raise Invalid("traceId", _bad_id(raw.get("traceId"), "a trace id"))
    attributes = key_values(raw.get("attributes"), "attributes")
    events = []
    raw_events = raw.get("events") or []
    if not isinstance(raw_events, list):
        raise Invalid("events", "must be a list")
    for i, event in enumerate(raw_events):
        if not isinstance(event, dict):
            raise Invalid(f"events[{i}]", "must be an object")
        events.append({"name": event.get("name"), "time": _nanos(event.get("timeUnixNano"), f"events[{i}].time"),
                       "attributes": key_values(event.get("attributes"), f"events[{i}].attributes")})
    name = raw.get("name")
    return Span(line, position, span_id, trace_id, name if isinstance(name, str) else "",
                _nanos(raw.get("startTimeUnixNano"), "startTimeUnixNano"),
                _nanos(raw.get("endTimeUnixNano"), "endTimeUnixNano"), attributes, resource, events,
                otlp_id(raw.get("parentSpanId"), 8))


def spans_of(doc: dict) -> list[tuple[Any, Any]]:
    """(resource attributes list, span) pairs of one export request; Invalid for a broken container."""
    out = []
    for r, rs in enumerate(doc["resourceSpans"]):
        if not isinstance(rs, dict):
            raise Invalid(f"resourceSpans[{r}]", "must be an object")
        resource = rs.get("resource") or {}
        attrs = resource.get("attributes") if isinstance(resource, dict) else None
        scopes = rs.get("scopeSpans", rs.get("instrumentationLibrarySpans")) or []
        if not isinstance(scopes, list):
            raise Invalid(f"resourceSpans[{r}].scopeSpans", "must be a list")
        for s, scope in enumerate(scopes):
            spans = scope.get("spans") if isinstance(scope, dict) else None
            if not isinstance(spans, list):
                raise Invalid(f"resourceSpans[{r}].scopeSpans[{s}].spans", "must be a list")
            out.extend((("resource", r, attrs), span) for span in spans)
    return out


# -- detection -------------------------------------------------------------------------------------------------

def otlp_convention(record: dict) -> str | None:
    """"langfuse", "openinference" or "otel" from the first span that tells them apart, else None. A span with a
    `langfuse.observation.*` attribute is the Langfuse SDK's, whatever else it carries (Langfuse's span
    processor may add its attributes to other instrumentations' spans); otherwise the first telling key
    decides."""
    for rs in record.get("resourceSpans") or []:
        if not isinstance(rs, dict):
            continue
        for scope in rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or []:
            for span in (scope.get("spans") or []) if isinstance(scope, dict) else []:
                attrs = span.get("attributes") if isinstance(span, dict) else None
                found = None
                for attr in attrs if isinstance(attrs, list) else []:
                    key = attr.get("key") if isinstance(attr, dict) else None
                    if not isinstance(key, str):
                        continue
                    if key.startswith("langfuse.observation."):
                        return "langfuse"
                    if found is None and (key.startswith("openinference.") or key.startswith("llm.")):
                        found = "openinference"
                    elif found is None and key.startswith("gen_ai."):
                        found = "otel"
                if found is not None:
                    return found
    return None


def detect_convention(sample: Sample, convention: str) -> bool | None:
    """An OTLP/JSON export whose spans follow `convention`: True; another convention: False; an export whose
    spans carry neither (only HTTP spans, say), or a logs export: None, a later record decides."""
    record = sample.value
    if isinstance(record, dict) and isinstance(record.get("resourceLogs"), list) and "resourceSpans" not in record:
        return None  # log records (content for spans, `otlp_logs`): the spans decide
    if not isinstance(record, dict) or not isinstance(record.get("resourceSpans"), list):
        return False
    found = otlp_convention(record)
    return None if found is None else found == convention
