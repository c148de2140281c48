"""Read recorded model calls (OpenAI Chat Completions logs, JSONL) into `TraceCall`s.

One line is `{"request": <chat.completions.create body>, "response": <ChatCompletion>}`. A line that cannot be
used becomes a `TraceLineError` naming the file, line and field, never an exception: every input line is
accounted for, either as a call or as an error row.

Other formats (OTel GenAI, OpenInference, Langfuse, Responses API: `toolaudit.ingest.formats`) are detected from the
first record and converted into an OpenAI-shaped temporary log (`TraceSource`) that the same machinery reads;
every call and error still names the original file, line and span.
"""

from __future__ import annotations

import contextvars
import functools
import json
import math
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from toolaudit import TraceError
from toolaudit.ingest import formats

DEFAULT_SESSION_KEY = "request.metadata.session_id"
DEFAULT_CUSTOMER_KEY = "request.metadata.customer"
CALL_INDEX_KEY = "request.metadata.call_index"
_CALL_INDEX_PARTS = tuple(CALL_INDEX_KEY.split("."))
KNOWN_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
EXCERPT_CHARS = 200


@dataclass(frozen=True)
class TraceCall:
    """One usable model call from a trace file."""

    source: str
    line: int
    session_id: str
    call_index: int
    customer: str | None
    request: dict
    response: dict | None
    record: str | None = None  # the span or observation id, for calls read from a span format

    @property
    def key(self) -> tuple[str, int]:
        return (self.session_id, self.call_index)

    @property
    def tools(self) -> list:
        tools = self.request.get("tools")
        return tools if isinstance(tools, list) else []

    @property
    def response_message(self) -> dict | None:
        """The first choice's assistant message, or None when the response has none."""
        return first_message(self.response)


def first_message(response: dict | None) -> dict | None:
    """A ChatCompletion's first choice's message, or None when it has none."""
    choices = (response or {}).get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = choices[0].get("message")
        return message if isinstance(message, dict) else None
    return None


@dataclass(frozen=True)
class TraceLineError:
    """A line that could not be used; stored as an error row and counted in the run."""

    source: str
    line: int
    field: str | None
    message: str
    excerpt: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: {self.field + ': ' if self.field else ''}{self.message}"


@dataclass
class TraceStats:
    """How every line and record of one file was accounted for: `lines = blank + (lines holding records)` and
    `records = calls + errors + skipped`. A record is a line of an OpenAI or Responses log, a span of an OTLP
    export, an observation of a Langfuse export (a line that cannot be read at all counts as one record)."""

    lines: int = 0
    blank: int = 0
    calls: int = 0
    errors: int = 0
    skipped: int = 0  # records that are not model calls (tool or agent spans, embeddings, duplicates...)
    records: int = 0


def get_dotted(obj: Any, dotted: str | tuple[str, ...]) -> Any:
    """Follow `a.b.c` (or its pre-split parts) through nested dicts; None when any step is missing."""
    for part in dotted.split(".") if isinstance(dotted, str) else dotted:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


@functools.lru_cache(maxsize=64)
def _split(dotted: str) -> tuple[str, ...]:
    return tuple(dotted.split("."))


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def _json_error(raw: bytes) -> tuple[str | None, str]:
    """Explain why orjson refused a line, in the words a user can act on."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"invalid UTF-8 at byte {exc.start}"
    try:
        json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:
        return None, "not valid JSON: nested too deeply"
    except ValueError as exc:
        if "is not valid JSON" in str(exc):
            return None, f"{exc} (NaN/Infinity are not allowed)"
        return None, f"not valid JSON: {exc}"
    return None, "not valid JSON"


def _check_request(request: Any) -> tuple[str, str] | None:
    """Return (field, message) for the first structural problem of a request, or None."""
    if not isinstance(request, dict):
        return "request", f"must be an object, got {type(request).__name__}"
    messages = request.get("messages")
    if not isinstance(messages, list):
        got = "missing" if messages is None else f"a {type(messages).__name__}"
        return "request.messages", f"must be a list, got {got}"
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            return f"request.messages[{i}]", f"must be an object, got {type(message).__name__}"
        role = message.get("role")
        if role not in KNOWN_ROLES:
            return f"request.messages[{i}].role", f"unknown role {role!r} (expected one of {sorted(KNOWN_ROLES)})"
    tools = request.get("tools")
    if tools is not None and not isinstance(tools, list):
        return "request.tools", f"must be a list, got {type(tools).__name__}"
    return None


def _as_key(value: Any) -> str | None:
    if isinstance(value, str) and value:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def _as_index(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and value >= 0:
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


@dataclass(frozen=True)
class RawCall:
    """A structurally valid line before its call index is known (that needs the lines before it)."""

    line: int
    session_id: str
    explicit_index: int | None
    customer: str | None
    request: dict
    response: dict | None


class CallIndexer:
    """Assigns call indices in line order (or takes `call_index`) and refuses duplicates.

    Kept apart from line parsing so that a file can be parsed in chunks by several processes and indexed
    afterwards, in line order, with exactly the result of a sequential read.
    """

    def __init__(self) -> None:
        self.next_index: dict[str, int] = {}
        self.seen: dict[tuple[str, int], int] = {}

    def assign(self, session_id: str, explicit: int | None, line: int) -> int | str:
        """The call index, or an error message for a duplicate."""
        if explicit is not None:
            index = explicit
            self.next_index[session_id] = max(self.next_index.get(session_id, 0), index + 1)
        else:
            index = self.next_index.get(session_id, 0)
            self.next_index[session_id] = index + 1
        first = self.seen.get((session_id, index))
        if first is not None:
            return f"duplicate call index {index} for session {session_id!r} (first seen at line {first})"
        self.seen[(session_id, index)] = line
        return index


def open_trace(path: str | Path):
    try:
        return Path(path).open("rb")
    except OSError as exc:
        raise TraceError(str(path), None, None, f"cannot open trace file: {exc.strerror or exc}") from None


def read_trace(
    path: str | Path,
    session_key: str = DEFAULT_SESSION_KEY,
    customer_key: str = DEFAULT_CUSTOMER_KEY,
    require_response: bool = True,
    stats: TraceStats | None = None,
    fmt: str | None = None,
    on_source: Callable[[TraceSource], None] | None = None,
) -> Iterator[TraceCall | TraceLineError]:
    """Yield a TraceCall or TraceLineError for every record of `path` (skipped records are only counted).

    `fmt`: one of `formats.FORMATS`; None detects it from the first record (or takes `use_format`'s).
    `on_source` is told how the file is read (format, skipped records and why) before the first item.
    Call order within a session is line order unless `request.metadata.call_index` is given (span formats:
    start time). A second call with the same (session, call index) is an error row: replays must not count a
    call twice. Raises TraceError only for problems with the file as a whole (missing, unreadable, empty, or
    not one usable call in it).
    """
    stats = stats if stats is not None else TraceStats()
    with tempfile.TemporaryDirectory(prefix="toolaudit-") as tmp:
        src = open_source(path, fmt, session_key, customer_key, tmp)
        if on_source is not None:
            on_source(src)
        if src.preset is not None:
            for name in ("lines", "blank", "records", "skipped"):
                setattr(stats, name, getattr(stats, name) + getattr(src.preset, name))
        first: list[TraceLineError] = []
        for err in src.errors:
            stats.errors += 1
            if len(first) < 3:  # named when the file turns out to hold no usable call
                first.append(err)
            yield err
        indexer = CallIndexer()
        with open_trace(src.path) as handle:
            for line_no, raw in enumerate(handle, start=1):
                if not src.converted:  # a converted file's lines and records are the original's (preset)
                    stats.lines += 1
                    stats.blank += not raw.strip()
                    stats.records += bool(raw.strip())
                if not raw.strip():
                    continue
                item = parse_line(raw, src.path, line_no, src.session_key, src.customer_key, require_response)
                if isinstance(item, RawCall):
                    item = index_call(item, raw, src.path, indexer, src.where(line_no)[1])
                if isinstance(item, TraceLineError):
                    item = src.translate(item)
                    stats.errors += 1
                    if len(first) < 3:
                        first.append(item)
                else:
                    source, line = src.where(line_no)
                    record = src.origins[line_no - 1].record if src.origins is not None else None
                    item = replace(item, source=source, line=line, record=record)
                    stats.calls += 1
                yield item
    src.check(stats, first)


_format_override: contextvars.ContextVar[str | None] = contextvars.ContextVar("trace_format", default=None)


@contextmanager
def use_format(fmt: str | None) -> Iterator[None]:
    """Read every trace file in this block as `fmt` (None: detect), for callers that cannot pass `fmt`."""
    token = _format_override.set(fmt)
    try:
        yield
    finally:
        _format_override.reset(token)


_RECORD_WORDS = {"otel": "span", "openinference": "span", "langfuse": "observation"}


@dataclass
class TraceSource:
    """A trace file as the readers see it: an OpenAI log is read where it is (`path == source`); any other
    format is converted into an OpenAI-shaped temporary log at `path`, whose line N came from `origins[N-1]`.
    `preset` holds the original file's lines, blank lines, records and skipped records; `errors` the records
    the conversion could not use, already naming the original file, line, span and attribute."""

    source: str
    fmt: str
    path: str
    session_key: str
    customer_key: str
    detected: bool = True
    origins: list[formats.Origin] | None = None
    errors: list[TraceLineError] = field(default_factory=list)
    preset: TraceStats | None = None
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def converted(self) -> bool:
        return self.origins is not None

    def where(self, line: int) -> tuple[str, int]:
        """The original file and line of line `line` of `path`."""
        return (self.source, line) if self.origins is None else (self.source, self.origins[line - 1].line)

    def translate(self, err: TraceLineError) -> TraceLineError:
        """An error found on the converted log, told in terms of the original file."""
        if self.origins is None:
            return err
        origin = self.origins[err.line - 1]
        fld, message = err.field, err.message
        if fld == "response" and origin.response_field:
            fld, message = origin.response_field, ("missing: the record holds no answer to compare (was message "
                                                   "content capture switched on?)")
        if origin.record:
            message = f"{_RECORD_WORDS.get(self.fmt, 'record')} {origin.record}: {message}"
        return TraceLineError(self.source, origin.line, fld, message, err.excerpt)

    def check(self, stats: TraceStats, first_errors: list[TraceLineError]) -> None:
        """Raise when the file held nothing, or no usable call: a run over it would measure nothing."""
        if stats.lines == stats.blank:
            raise TraceError(self.source, None, None, "file is empty: expected one JSON object per line")
        if stats.calls == 0:
            raise TraceError(self.source, None, None, no_calls_message(self, stats, first_errors))


def no_calls_message(src: TraceSource, stats: TraceStats, first_errors: list[TraceLineError]) -> str:
    parts = []
    if stats.errors:
        shown = "; ".join(f"line {e.line}: {e.field + ': ' if e.field else ''}{e.message}"
                          for e in sorted(first_errors, key=lambda e: e.line)[:3])
        parts.append(f"every record failed ({stats.errors} error rows; first: {shown})")
    if stats.skipped:
        top = sorted(src.skipped.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
        parts.append(f"{stats.skipped} records skipped as not model calls ("
                     + ", ".join(f"{n} {reason}" for reason, n in top) + ")")
    how = "detected" if src.detected else "as asked"
    return (f"no usable calls: {'; '.join(parts) or 'no records'}. Read as {src.fmt} ({how}; formats: "
            f"{', '.join(formats.FORMATS)}: use --format to choose)")


def open_source(path: str | Path, fmt: str | None = None, session_key: str = DEFAULT_SESSION_KEY,
                customer_key: str = DEFAULT_CUSTOMER_KEY, tmpdir: str | None = None) -> TraceSource:
    """Detect (or take) the file's format; convert it into `tmpdir` unless it is an OpenAI log."""
    source = str(path)
    open_trace(path).close()
    forced = fmt or _format_override.get()
    if forced is not None and forced not in formats.FORMATS:
        raise TraceError(source, None, None, f"unknown format {forced!r} (known: {', '.join(formats.FORMATS)})")
    chosen = forced or formats.detect_format(source)[0]
    if chosen == "openai":
        return TraceSource(source, chosen, source, session_key, customer_key, detected=forced is None)
    conv = formats.convert(source, chosen, formats.Keys.from_options(session_key, customer_key))
    handle = tempfile.NamedTemporaryFile("wb", dir=tmpdir, prefix=Path(source).stem[:40] + "-", suffix=".jsonl",
                                         delete=False)
    with handle:
        origins = conv.write(handle)
    word = _RECORD_WORDS.get(chosen, "record")
    errors = [TraceLineError(source, p.line, p.field, f"{word} {p.record}: {p.message}" if p.record else p.message,
                             p.excerpt) for p in conv.problems]
    preset = TraceStats(lines=conv.lines, blank=conv.blank, records=conv.records, skipped=sum(conv.skipped.values()))
    return TraceSource(source, chosen, handle.name, DEFAULT_SESSION_KEY, DEFAULT_CUSTOMER_KEY, forced is None,
                       origins, errors, preset, dict(conv.skipped))


def _hint(record: Any) -> str:
    return formats.mixed(record, "openai")


def index_call(item: RawCall, raw: bytes, source: str, indexer: CallIndexer,
               shown_line: int | None = None) -> TraceCall | TraceLineError:
    """`shown_line`: the line duplicates are reported at (the original file's, for a converted log)."""
    index = indexer.assign(item.session_id, item.explicit_index, item.line if shown_line is None else shown_line)
    if isinstance(index, str):
        return line_error(raw, source, item.line, CALL_INDEX_KEY, index)
    return TraceCall(source, item.line, item.session_id, index, item.customer, item.request, item.response)


def line_error(raw: bytes, source: str, line_no: int, field: str | None, message: str) -> TraceLineError:
    excerpt = raw[:EXCERPT_CHARS].decode("utf-8", errors="replace").rstrip()
    return TraceLineError(source, line_no, field, message, excerpt)


def parse_line(raw: bytes, source: str, line_no: int, session_key: str, customer_key: str,
               require_response: bool) -> RawCall | TraceLineError:
    """Everything about one line that does not depend on other lines."""
    try:
        record = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return line_error(raw, source, line_no, *_json_error(raw))
    if not isinstance(record, dict):
        return line_error(raw, source, line_no, None, f"line must be a JSON object, got {type(record).__name__}")
    if "request" not in record:
        return line_error(raw, source, line_no, "request",
                          "missing (each line is {\"request\": ..., \"response\": ...})" + _hint(record))
    problem = _check_request(record["request"])
    if problem:
        return line_error(raw, source, line_no, problem[0], problem[1] + _hint(record))
    request = record["request"]
    response = record.get("response")
    if response is not None and not isinstance(response, dict):
        return line_error(raw, source, line_no, "response", f"must be an object, got {type(response).__name__}")
    if require_response and response is None:
        return line_error(raw, source, line_no, "response",
                          "missing: comparing recorded logs needs the recorded response")

    session_id = _as_key(get_dotted(record, _split(session_key)))
    if session_id is None:
        return line_error(raw, source, line_no, session_key,
                          "missing or not a string: cannot tell which session this call belongs to "
                          "(use --session-key to name another field)")
    customer = _as_key(get_dotted(record, _split(customer_key)))
    explicit = get_dotted(record, _CALL_INDEX_PARTS)
    index = None
    if explicit is not None:
        index = _as_index(explicit)
        if index is None:
            return line_error(raw, source, line_no, CALL_INDEX_KEY,
                              f"must be a non-negative integer, got {explicit!r}")
    return RawCall(line_no, session_id, index, customer, request, response)
