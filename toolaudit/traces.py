"""Read recorded model calls (OpenAI Chat Completions logs, JSONL) into `TraceCall`s.

One line is `{"request": <chat.completions.create body>, "response": <ChatCompletion>}`. A line that cannot be
used becomes a `TraceLineError` naming the file, line and field, never an exception: every input line is
accounted for, either as a call or as an error row.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from toolaudit.errors import TraceError

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
    """How every line of one file was accounted for."""

    lines: int = 0
    blank: int = 0
    calls: int = 0
    errors: int = 0


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
) -> Iterator[TraceCall | TraceLineError]:
    """Yield a TraceCall or TraceLineError for every non-blank line of `path`.

    Call order within a session is line order unless `request.metadata.call_index` is given. A second line
    with the same (session, call index) is an error row: replays must not count a call twice.
    Raises TraceError only for problems with the file as a whole (missing, unreadable, empty).
    """
    source = str(path)
    stats = stats if stats is not None else TraceStats()
    indexer = CallIndexer()
    with open_trace(path) as handle:
        for line_no, raw in enumerate(handle, start=1):
            stats.lines += 1
            if not raw.strip():
                stats.blank += 1
                continue
            item = parse_line(raw, source, line_no, session_key, customer_key, require_response)
            if isinstance(item, RawCall):
                item = index_call(item, raw, source, indexer)
            if isinstance(item, TraceLineError):
                stats.errors += 1
            else:
                stats.calls += 1
            yield item
    if stats.lines == stats.blank:
        raise TraceError(source, None, None, "file is empty: expected one JSON object per line")


def index_call(item: RawCall, raw: bytes, source: str, indexer: CallIndexer) -> TraceCall | TraceLineError:
    index = indexer.assign(item.session_id, item.explicit_index, item.line)
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
                          "missing (each line is {\"request\": ..., \"response\": ...})")
    problem = _check_request(record["request"])
    if problem:
        return line_error(raw, source, line_no, *problem)
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
