"""OTLP/JSON log exports (`{"resourceLogs": [{"resource", "scopeLogs": [{"scope", "logRecords": [...]}]}]}`), whose
records carry a model call's content for the span they name (trace id + span id).

GenAI instrumentations emit content as log records (events) instead of span attributes in some modes:
`opentelemetry-instrumentation-openai-v2` 2.x with `opentelemetry-util-genai` in event mode emits one
`gen_ai.client.inference.operation.details` record per call, its `gen_ai.input.messages`,
`gen_ai.output.messages`, `gen_ai.system_instructions` and `gen_ai.tool.definitions` as attributes (structured
values); earlier releases emit one record per message (`gen_ai.system.message`, `gen_ai.user.message`,
`gen_ai.assistant.message`, `gen_ai.tool.message`, `gen_ai.choice`) with the message in the body. The records
are indexed by span (`LogIndex`) before the spans are read, and joined to their span (`join`): the first as
attributes the span lacks, the others as the span's events (the older event form the OTel reader reads).
The index holds every log record's content in memory while the file is read.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolaudit.ingest.formats.base import Invalid, load_line
from toolaudit.ingest.formats.otlp import Span, any_value, key_values, otlp_id
from toolaudit.ingest.formats.otlp_docs import Documents, is_pretty
from toolaudit.ingest.records import TraceStats

LOGS = "resourceLogs"
JOINED_ATTRIBUTES = ("gen_ai.system_instructions", "gen_ai.input.messages", "gen_ai.output.messages",
                     "gen_ai.tool.definitions")


@dataclass(frozen=True)
class LogEvent:
    name: str | None  # `eventName`, else the `event.name` attribute
    time: int | None
    attributes: dict[str, Any]  # the record's attributes, with a key-value body's entries added


def records_of(doc: dict) -> list[Any]:
    """The log records of one export request; Invalid for a broken container."""
    out = []
    for r, rl in enumerate(doc[LOGS]):
        scopes = rl.get("scopeLogs") if isinstance(rl, dict) else None
        if not isinstance(scopes, list):
            raise Invalid(f"{LOGS}[{r}].scopeLogs", "must be a list")
        for s, scope in enumerate(scopes):
            records = scope.get("logRecords") if isinstance(scope, dict) else None
            if not isinstance(records, list):
                raise Invalid(f"{LOGS}[{r}].scopeLogs[{s}].logRecords", "must be a list")
            out.extend(records)
    return out


def decode_log(raw: Any) -> tuple[tuple[str, str] | None, LogEvent]:
    """((trace id, span id) or None when the record names no span, the event); Invalid for a broken record."""
    if not isinstance(raw, dict):
        raise Invalid(None, f"a log record must be an object, got {type(raw).__name__}")
    attributes = key_values(raw.get("attributes"), "attributes")
    body = any_value(raw["body"], "body") if isinstance(raw.get("body"), dict) else None
    if isinstance(body, dict):
        attributes = {**body, **attributes}
    elif body is not None:
        attributes.setdefault("content", body)
    name = raw.get("eventName") or attributes.get("event.name")
    time = raw.get("timeUnixNano") or raw.get("observedTimeUnixNano")
    trace, span = otlp_id(raw.get("traceId"), 16), otlp_id(raw.get("spanId"), 8)
    event = LogEvent(name if isinstance(name, str) else None,
                     int(time) if isinstance(time, (int, str)) and str(time).isdigit() else None, attributes)
    return ((trace, span) if trace and span else None), event


class LogIndex:
    """Every log record of some OTLP/JSON files that names a span, by (trace id, span id)."""

    def __init__(self) -> None:
        self.by_span: dict[tuple[str, str], list[LogEvent]] = {}

    def __bool__(self) -> bool:
        return bool(self.by_span)

    def read(self, path: str | Path) -> None:
        """Index the log records of a file (a line-per-request or pretty-printed export; lines of spans in the
        same file are passed over cheaply, and broken records left for the scan to report)."""
        for doc in _log_documents(str(path)):
            try:
                records = records_of(doc)
            except Invalid:
                continue
            for raw in records:
                try:
                    ids, event = decode_log(raw)
                except Invalid:
                    continue
                if ids is not None:
                    self.by_span.setdefault(ids, []).append(event)

    def join(self, span: Span) -> None:
        """The span's log records joined to it: content attributes it lacks, the other records as its events."""
        events = self.by_span.get((span.trace_id, span.span_id))
        if not events:
            return
        for event in sorted(events, key=lambda e: e.time or 0):
            content = [key for key in JOINED_ATTRIBUTES if event.attributes.get(key) is not None]
            if content:
                for key in content:
                    if span.attributes.get(key) is None:
                        span.attributes[key] = event.attributes[key]
            elif event.name is not None:
                span.events.append({"name": event.name, "time": event.time, "attributes": event.attributes})


def _log_documents(path: str) -> Iterator[dict]:
    if is_pretty(path):
        for _, _, _, value, _ in Documents(path, TraceStats()):
            if isinstance(value, dict) and isinstance(value.get(LOGS), list):
                yield value
        return
    marker = f'"{LOGS}"'.encode()
    with open(path, "rb") as handle:
        for raw in handle:
            if marker in raw:
                value, error = load_line(raw)
                if error is None and isinstance(value, dict) and isinstance(value.get(LOGS), list):
                    yield value
