"""Arize Phoenix's own span export: the JSON of its REST API `GET /v1/projects/{project}/spans`, one span or
one response page per line.

A span is `{"id", "name", "context": {"trace_id", "span_id"}, "span_kind", "parent_id", "start_time",
"end_time", "status_code", "status_message", "attributes", "events"}`: Phoenix takes `openinference.span.kind`
out of the attributes into `span_kind`, writes times as ISO 8601 and attributes as dotted keys
(`llm.input_messages.0.message.role`), having parsed JSON-string attributes such as `metadata` into objects
(so `using_metadata({"customer": ...})` arrives as `metadata.customer`). Nested attribute objects, or the
attributes as a JSON string (its GraphQL API), are flattened the same way. A page is `{"data": [spans...],
"next_cursor": ...}`.

Spans are then OpenInference spans: the same conversion (`openinference.span_to_call`) turns an LLM span into a
call and skips the others. A call span without the session or customer takes it from its nearest ancestor
(`parent_id`) that has it, else from any span of its trace, as in an OTLP export (`otlp_export`).
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime, timezone
from typing import Any

from toolaudit.ingest.formats.base import (
    Conversion,
    Invalid,
    Keys,
    canonical_bytes,
    json_value,
    load_line,
    record_lines,
)
from toolaudit.ingest.formats.contract import Sample, TraceFormat
from toolaudit.ingest.formats.openinference import CONTEXT, CUSTOMER_ATTRS, KIND, SESSION_ATTR, span_to_call
from toolaudit.ingest.formats.otlp import Span
from toolaudit.ingest.formats.span_family import Family
from toolaudit.ingest.registry import mixed

_FRACTION = re.compile(r"(\.\d{6})\d+")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_FIELDS = {"startTimeUnixNano": "start_time", "endTimeUnixNano": "end_time"}  # the OTLP reader's names, here


def looks_like_phoenix(record: Any) -> bool:
    context = record.get("context") if isinstance(record, dict) else None
    return isinstance(context, dict) and "span_id" in context and "span_kind" in record


def detect(sample: Sample) -> bool:
    """A Phoenix span (`context` with `span_id`, and `span_kind`) or a page of them."""
    record = sample.value
    if not isinstance(record, dict):
        return False
    if looks_like_phoenix(record):
        return True
    data = record.get("data")
    return isinstance(data, list) and bool(data) and all(looks_like_phoenix(d) for d in data[:5])


def read(path: str, keys: Keys) -> Conversion:
    conv = Conversion("phoenix", by_session=True)
    spans: list[tuple[Span, Any]] = []
    seen: dict[tuple[str, str], tuple[int, bytes]] = {}
    position = 0
    for line_no, raw in record_lines(path, conv):
        record, error = load_line(raw)
        if error is None and isinstance(record, dict) and isinstance(record.get("data"), list):
            items = record["data"]
        elif error is None and isinstance(record, dict) and ("context" in record or "span_kind" in record):
            items = [record]  # a span, perhaps a broken one: its error names the field
        else:
            conv.records += 1
            conv.problem(line_no, None, None, error or (
                "not a Phoenix span (with \"context\" and \"span_kind\") or page of spans (with \"data\")"
                + mixed(record, "phoenix")), raw)
            continue
        for item in items:
            conv.records += 1
            position += 1
            record_id = _span_id(item)
            try:
                span = decode(item, line_no, position)
            except Invalid as exc:
                conv.problem(line_no, record_id, exc.field, exc.message, item)
                continue
            except RecursionError:
                conv.problem(line_no, record_id, None, "nested too deeply", item)
                continue
            ids = (span.trace_id, span.span_id)
            digest = hashlib.blake2b(canonical_bytes(item), digest_size=16).digest()
            first = seen.get(ids)
            if first is not None:
                if first[1] == digest:
                    conv.skip("duplicate export of a span")
                else:
                    conv.problem(line_no, record_id, "context.span_id", f"duplicate span id (first at line "
                                                                         f"{first[0]}) with different content", item)
                continue
            seen[ids] = (line_no, digest)
            spans.append((span, item))
    family = Family()
    for span, _ in spans:
        family.add((span.trace_id, span.span_id), span.parent_id, CONTEXT.of(span, keys))
    for span, item in spans:
        try:
            if str(span.attributes.get(KIND)).upper() == "LLM":
                _inherit(span, family, keys)
            result = span_to_call(span, keys)
        except Invalid as exc:
            conv.problem(span.line, span.span_id, _FIELDS.get(exc.field, exc.field), exc.message, item)
            continue
        except RecursionError:
            conv.problem(span.line, span.span_id, None, "nested too deeply", item)
            continue
        if isinstance(result, str):
            conv.skip(result)
        else:
            conv.calls.append(result)
    return conv


FORMAT = TraceFormat(name="phoenix", description="Arize Phoenix span exports (its REST API's span JSON), one span "
                     "or page per line", detect=detect, read=read, record_word="span",
                     looks_like="a Phoenix span export record")


def _span_id(item: Any) -> str | None:
    context = item.get("context") if isinstance(item, dict) else None
    span_id = context.get("span_id") if isinstance(context, dict) else None
    return span_id if isinstance(span_id, str) and span_id else None


def decode(item: Any, line: int, position: int) -> Span:
    """A Phoenix span as the OTLP reader's `Span`: flat attributes, `span_kind` back as
    `openinference.span.kind`."""
    if not isinstance(item, dict):
        raise Invalid(None, f"a span must be an object, got {type(item).__name__}")
    context = item.get("context")
    if not isinstance(context, dict):
        raise Invalid("context", "missing: a span needs {\"trace_id\", \"span_id\"}")
    span_id, trace_id = context.get("span_id"), context.get("trace_id")
    if not isinstance(span_id, str) or not span_id:
        raise Invalid("context.span_id", "missing: every span needs an id")
    if not isinstance(trace_id, str) or not trace_id:
        raise Invalid("context.trace_id", "missing: every span needs a trace id")
    raw = item.get("attributes")
    if isinstance(raw, str):
        raw = json_value(raw, "attributes")
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise Invalid("attributes", f"must be an object, got {type(raw).__name__}")
    attributes: dict[str, Any] = {}
    _flatten(raw, "", attributes)
    kind = item.get("span_kind")
    if isinstance(kind, str) and kind and KIND not in attributes:
        attributes[KIND] = kind
    parent = item.get("parent_id")
    name = item.get("name")
    return Span(line, position, span_id, trace_id, name if isinstance(name, str) else "",
                _time(item.get("start_time"), "start_time"), _time(item.get("end_time"), "end_time"),
                attributes, {}, parent_id=parent if isinstance(parent, str) and parent else None)


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    """Phoenix's flattening: objects by key, lists of objects by index, other values (lists of strings) kept."""
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(item, f"{prefix}.{key}" if prefix else str(key), out)
    elif isinstance(value, list) and any(isinstance(v, dict) for v in value):
        for index, item in enumerate(value):
            if isinstance(item, dict):
                _flatten(item, f"{prefix}.{index}", out)
    elif value is not None and prefix:
        out[prefix] = value


def _time(value: Any, field_name: str) -> int | None:
    """An ISO 8601 time as Unix nanoseconds (microsecond precision, as Phoenix stores it); None when absent."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise Invalid(field_name, f"must be an ISO 8601 time, got {type(value).__name__}")
    text = _FRACTION.sub(r"\1", value.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise Invalid(field_name, f"not an ISO 8601 time: {value!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000


def _inherit(span: Span, family: Family, keys: Keys) -> None:
    """Set a call span's inherited session and customer (`span_family`) under the attribute the reader looks for.
    Raises Invalid when a named `--session-key` is nowhere to be found."""
    own = CONTEXT.of(span, keys)
    session, customer = family.inherited((span.trace_id, span.span_id), span.parent_id, own)
    own_session, own_customer = own or (None, None)
    if own_session is None:
        if session is not None:
            span.attributes[keys.session or SESSION_ATTR] = session
        elif keys.session is not None:
            raise Invalid(keys.session, "missing or not a string on the span, its parent spans and its trace: cannot "
                                        "tell which session this call belongs to (use --session-key to name another "
                                        "attribute)")
    if own_customer is None and customer is not None:
        span.attributes[keys.customer or CUSTOMER_ATTRS[0]] = customer
