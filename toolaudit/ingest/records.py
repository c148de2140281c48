"""What reading a trace file yields, whatever its format: calls (`RawCall` before its call index is known,
`TraceCall` after), error rows (`TraceLineError`, naming the file, line, field and span) and the accounting of
every line and record (`TraceStats`).

`CallIndexer` gives calls their index within the session, in file order, exactly as compare's SQL staging does
for logs scanned in parallel chunks.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

DEFAULT_SESSION_KEY = "request.metadata.session_id"
DEFAULT_CUSTOMER_KEY = "request.metadata.customer"
CALL_INDEX_KEY = "request.metadata.call_index"
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


def system_fingerprint(response: dict | None) -> str | None:
    """A ChatCompletion's system fingerprint: a string, or None (a recorded number or object is not one)."""
    value = (response or {}).get("system_fingerprint")
    return value if isinstance(value, str) else None


def finish_reason(response: dict | None) -> str | None:
    """A ChatCompletion's first choice's finish reason as recorded ("stop", "length", "tool_calls"...), or None
    (absent, or not a string)."""
    choices = (response or {}).get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        value = choices[0].get("finish_reason")
        return value if isinstance(value, str) else None
    return None


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


@dataclass(frozen=True)
class RawCall:
    """A usable call before its call index is known (that needs the calls before it in the file).

    `line` is the line of the user's file; `key` is where the source finds the call again (a log's byte offset,
    a whole-file reader's position); `record` the span or observation id, for span formats."""

    line: int
    session_id: str
    explicit_index: int | None
    customer: str | None
    request: dict
    response: dict | None
    key: int = 0
    record: str | None = None
    inherits: bool = False  # its session is decided when its source settles (a span's, from its parent spans)


class CallIndexer:
    """Assigns call indices in line order (or takes `call_index`) and refuses duplicates.

    Kept apart from parsing so that a file can be parsed in chunks by several processes and indexed
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


def line_error(raw: bytes, source: str, line_no: int, field: str | None, message: str) -> TraceLineError:
    """An error row whose excerpt is the start of the raw line."""
    excerpt = raw[:EXCERPT_CHARS].decode("utf-8", errors="replace").rstrip()
    return TraceLineError(source, line_no, field, message, excerpt)


def get_dotted(obj: Any, dotted: str | tuple[str, ...]) -> Any:
    """Follow `a.b.c` (or its pre-split parts) through nested dicts; None when any step is missing."""
    for part in dotted.split(".") if isinstance(dotted, str) else dotted:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a whole file's records are built, and restore its state.

    Parsed JSON is millions of small acyclic containers that all stay alive: the collector finds nothing to free
    among them, yet its passes over the growing heap cost more than the parsing (orjson.loads of a 217 MB OTLP
    export: 1.2 s paused, 5.2 s not). Reference counting still frees everything that is dropped."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
