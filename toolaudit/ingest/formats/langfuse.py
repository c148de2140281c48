"""Langfuse exports: traces and observations, one JSON object per line.

Accepted lines (they may be mixed in one file, in any order):
- a trace with its observations embedded: `{"id", "sessionId", "userId", "observations": [{...}, ...]}` (the
  shape of `GET /api/public/traces/{id}`); observations listed by id only are expected as lines of their own;
- an observation: `{"id", "traceId", "type", "startTime", "model", "modelParameters", "input", "output",
  "usage"}` (the shape of `GET /api/public/observations`), joined to its trace's line when there is one;
- an API page `{"data": [traces or observations], "meta": {...}}`.

A call is a `GENERATION` observation; other observations (SPAN, EVENT, TOOL...) are skipped with their type.
`input` is a list of Chat messages, `{"messages": [...], "tools": [...]}` (the OpenAI integration's shape) or a
string; `output` an assistant message, a ChatCompletion or a string. The session is the trace's `sessionId`
(else the observation's, else the trace id), the customer the trace's `userId`; `--session-key` /
`--customer-key` name a dotted field of the observation, then of its trace (e.g. `metadata.tenant`). A
session's calls are ordered by `startTime`.
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime, timezone
from typing import Any

from toolaudit.ingest.formats import langfuse_fields, langfuse_otel
from toolaudit.ingest.formats.base import (
    Call,
    Conversion,
    Invalid,
    Keys,
    Origin,
    as_key,
    canonical_bytes,
    chat_response,
    get_dotted,
    load_line,
    record_lines,
    usage_block,
)
from toolaudit.ingest.formats.contract import Sample, TraceFormat
from toolaudit.ingest.formats.otlp import detect_convention
from toolaudit.ingest.formats.otlp_docs import first_document, is_pretty
from toolaudit.ingest.formats.otlp_export import open_export
from toolaudit.ingest.registry import mixed
from toolaudit.ingest.sources import TraceSource

LANGFUSE_TYPES = frozenset({"GENERATION", "SPAN", "EVENT", "AGENT", "TOOL", "CHAIN", "RETRIEVER", "EVALUATOR",
                            "EMBEDDING", "GUARDRAIL"})
_FRACTION = re.compile(r"(\.\d{6})\d+")
_SNIFF_BYTES = 64 << 20


def read(path: str, keys: Keys) -> Conversion:
    conv = Conversion("langfuse", by_session=True)
    traces: dict[str, dict] = {}
    found: list[tuple[int, Any, str | None]] = []  # (line, observation, trace id of the enclosing trace)
    for line_no, raw in record_lines(path, conv):
        record, error = load_line(raw)
        if error is None and isinstance(record, dict) and isinstance(record.get("data"), list):
            items = record["data"]
        else:
            items = [record]
        for item in items if error is None else [None]:
            if error is None and isinstance(item, dict) and isinstance(item.get("observations"), list):
                if isinstance(item.get("id"), str):
                    traces.setdefault(item["id"], item)
                found.extend((line_no, obs, item.get("id")) for obs in item["observations"]
                             if not isinstance(obs, str))  # ids only: the observation has a line of its own
            elif error is None and isinstance(item, dict) and looks_like_langfuse(item):
                found.append((line_no, item, None))
            else:
                conv.records += 1
                conv.problem(line_no, None, None, error or (
                    "not a Langfuse trace (with \"observations\") or observation (with \"traceId\" and "
                    "\"type\")" + mixed(item, "langfuse")), raw)
    seen: dict[str, tuple[int, bytes]] = {}
    for position, (line_no, obs, trace_id) in enumerate(found):
        conv.records += 1
        record_id = obs.get("id") if isinstance(obs, dict) and isinstance(obs.get("id"), str) else None
        try:
            result = _observation(obs, trace_id, traces, keys, line_no, position, seen)
        except Invalid as exc:
            conv.problem(line_no, record_id, exc.field, exc.message, obs)
            continue
        except RecursionError:
            conv.problem(line_no, record_id, None, "nested too deeply", obs)
            continue
        if isinstance(result, str):
            conv.skip(result)
        else:
            conv.calls.append(result)
    return conv


def looks_like_langfuse(record: dict) -> bool:
    return isinstance(record.get("observations"), list) or (
        "traceId" in record and ("type" in record or "startTime" in record)) or (
        record.get("type") in LANGFUSE_TYPES and "id" in record)


def detect(sample: Sample) -> bool | None:
    """A trace (with observations), an observation, or an API page of them; or an OTLP/JSON export of the SDK's
    spans (undecided, None, while its spans carry no telling attribute); not a log line."""
    record = sample.value
    if isinstance(record, dict) and (isinstance(record.get("resourceSpans"), list) or
                                     isinstance(record.get("resourceLogs"), list)):
        return detect_convention(sample, "langfuse")
    if not isinstance(record, dict) or "request" in record or "response" in record:
        return False
    if looks_like_langfuse(record):
        return True
    data = record.get("data")
    return isinstance(data, list) and bool(data) and all(isinstance(d, dict) and looks_like_langfuse(d)
                                                         for d in data[:5])


def open_langfuse(path: str, keys: Keys, require_response: bool = True, detected: bool = True) -> TraceSource:
    """The SDK's spans (an OTLP/JSON export) through the span convention, a server export read whole."""
    if _is_otlp_export(path):
        return _open_spans(path, keys, require_response, detected)
    from toolaudit.ingest.held import HeldRecords  # (imports the format registry: not at module import)

    return HeldRecords.read(path, SERVER_EXPORT, keys, require_response, detected)


def _is_otlp_export(path: str) -> bool:
    if is_pretty(path):
        document = first_document(path, _SNIFF_BYTES)
        return isinstance(document, dict) and ("resourceSpans" in document or "resourceLogs" in document)
    with open(path, "rb") as handle:
        for raw in handle:
            if raw.strip():
                record, error = load_line(raw[:_SNIFF_BYTES])
                return error is None and isinstance(record, dict) and (
                    "resourceSpans" in record or "resourceLogs" in record)
    return False


_open_spans = open_export("langfuse", langfuse_otel.span_to_call, langfuse_otel.CONTEXT)
DESCRIPTION = ("Langfuse: server exports (traces, observations or API pages, one per line) or the SDK's spans in "
               "OTLP/JSON exports")
# the server export's reader, as the held records of `open_langfuse` see it
SERVER_EXPORT = TraceFormat(name="langfuse", description=DESCRIPTION, detect=detect, read=read,
                            record_word="observation", looks_like="a Langfuse export record")
FORMAT = TraceFormat(name="langfuse", description=DESCRIPTION, detect=detect, open=open_langfuse,
                     record_word="observation", looks_like="a Langfuse export record")


def _observation(obs: Any, trace_id: str | None, traces: dict, keys: Keys, line: int, position: int,
                 seen: dict) -> Call | str:
    if not isinstance(obs, dict):
        raise Invalid("observations", f"an observation must be an object, got {type(obs).__name__}")
    obs_id = obs.get("id")
    if not isinstance(obs_id, str) or not obs_id:
        raise Invalid("id", "missing: every observation needs an id" if obs_id in (None, "") else
                      f"must be a non-empty string, got {type(obs_id).__name__} {str(obs_id)[:40]!r}")
    digest = hashlib.blake2b(canonical_bytes(obs), digest_size=16).digest()
    first = seen.get(obs_id)
    if first is not None:
        if first[1] == digest:
            return "duplicate export of an observation"
        raise Invalid("id", f"duplicate observation id (first at line {first[0]}) with different content")
    seen[obs_id] = (line, digest)
    kind = obs.get("type")
    if kind != "GENERATION":
        return f"observation type {kind!r}"
    trace_id = as_key(obs.get("traceId")) or trace_id
    trace = traces.get(trace_id, {}) if trace_id else {}
    session = _session(obs, trace, trace_id, keys)
    customer = _field(obs, trace, keys.customer) if keys.customer else (
        as_key(trace.get("userId")) or as_key(obs.get("userId")))
    start = _time(obs.get("startTime"), "startTime")
    request = langfuse_fields.request(obs)
    output = obs.get("output")
    response = None
    if output is not None:
        usage = obs.get("usage") if isinstance(obs.get("usage"), dict) else obs.get("usageDetails")
        usage = usage if isinstance(usage, dict) else {}
        response = chat_response(langfuse_fields.answer(output), langfuse_fields.finish_reason(output),
                                 model=obs.get("model"),
                                 created=int(start.timestamp()),
                                 usage=usage_block(usage.get("input", usage.get("promptTokens")),
                                                   usage.get("output", usage.get("completionTokens"))))
    return Call(session, customer, request, response, Origin(line, obs_id, "output"),
                order=(start.timestamp(), line, position))


def _field(obs: dict, trace: dict, dotted: str) -> str | None:
    value = as_key(get_dotted(obs, dotted))
    return value if value is not None else as_key(get_dotted(trace, dotted))


def _session(obs: dict, trace: dict, trace_id: str | None, keys: Keys) -> str:
    if keys.session is not None:
        value = _field(obs, trace, keys.session)
        if value is None:
            raise Invalid(keys.session, "missing or not a string on the observation and its trace: cannot tell "
                                        "which session this call belongs to (use --session-key to name another "
                                        "field)")
        return value
    value = as_key(trace.get("sessionId")) or as_key(obs.get("sessionId")) or trace_id
    if value is None:
        raise Invalid("traceId", "missing: without a trace id or a sessionId the call has no session")
    return value


def _time(value: Any, field_name: str) -> datetime:
    if value is None or value == "":
        raise Invalid(field_name, "missing: the call cannot be placed in its session's order")
    if not isinstance(value, str):
        raise Invalid(field_name, f"must be an ISO 8601 time string, got {type(value).__name__} {str(value)[:40]}")
    text = _FRACTION.sub(r"\1", value.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise Invalid(field_name, f"not an ISO 8601 time: {value!r}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)
