"""A whole-file reader's calls, checked and held in memory as records (`HeldRecords`).

Spans arrive unordered and batched, and Langfuse joins observations to traces across lines, so these formats
need the whole file before a session's calls can be ordered. The reader's `Conversion` is turned into exactly
the records an OpenAI log line would give: each call's request carries its session, customer and call index in
`request.metadata` (as `toolaudit import` writes it), is checked as a log line is (`check_request`, a recorded
answer when one is required, a usable call index), and every error row names the user's file, the line, the span
or observation id and the attribute. Calls are held in the order a session's calls are indexed in (start time);
a call is found again by its position.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import orjson

from toolaudit.ingest import deepjson
from toolaudit.ingest.formats.base import Call, Conversion, Keys
from toolaudit.ingest.formats.contract import TraceFormat
from toolaudit.ingest.formats.openai_lines import NO_RESPONSE, as_index, as_key, check_request
from toolaudit.ingest.records import (
    CALL_INDEX_KEY,
    DEFAULT_SESSION_KEY,
    RawCall,
    TraceLineError,
    TraceStats,
    collector_paused,
    line_error,
)
from toolaudit.ingest.sources import Item, TraceSource

NO_ANSWER = "missing: the record holds no answer to compare (was message content capture switched on?)"


def chat_request(call: Call) -> dict:
    """The call's request with its session, customer and call index in `metadata` (what an OpenAI log holds)."""
    request = dict(call.request)
    metadata = dict(request["metadata"]) if isinstance(request.get("metadata"), dict) else {}
    metadata["session_id"] = call.session_id
    if call.customer is not None:
        metadata["customer"] = call.customer
    if call.call_index is not None:
        metadata["call_index"] = call.call_index
    request["metadata"] = metadata
    return request


def log_line(request: dict, response: dict | None) -> bytes:
    """The call as one OpenAI-log line (for an error row's excerpt)."""
    record = {"request": request, "response": response}
    try:
        return orjson.dumps(record)
    except TypeError:  # nested past orjson's 254 levels
        return deepjson.dumps(record, sort_keys=False).encode()


class HeldRecords(TraceSource):
    """A file read whole by its format's reader: ranges are ranges of positions, keys are positions."""

    def __init__(self, path: str, fmt: TraceFormat, conv: Conversion, require_response: bool = True,
                 detected: bool = True):
        super().__init__(str(path), fmt.name, detected)
        self.word = fmt.record_word
        self.require_response = require_response
        self.preset = TraceStats(lines=conv.lines, blank=conv.blank, records=conv.records,
                                 skipped=sum(conv.skipped.values()))
        self.skipped = dict(conv.skipped)
        self.errors = [TraceLineError(self.source, p.line, p.field, self._named(p.record, p.message), p.excerpt)
                       for p in conv.problems]
        self.calls: list[RawCall] = []
        self.shown = []
        for call in conv.ordered():
            item = self._check(call)
            if isinstance(item, RawCall):
                self.calls.append(item)
                self.shown.append(item.line)
            else:
                self.errors.append(item)
        self.size = os.path.getsize(self.source)

    @classmethod
    def read(cls, path: str, fmt: TraceFormat, keys: Keys, require_response: bool = True,
             detected: bool = True) -> HeldRecords:
        """Read `path` whole with `fmt`'s reader (the collector paused: see `collector_paused`)."""
        if fmt.read is None:
            raise ValueError(f"trace format {fmt.name!r} opens its own sources: it is not read whole")
        with collector_paused():
            return cls(path, fmt, fmt.read(str(path), keys), require_response, detected)

    def _named(self, record: str | None, message: str) -> str:
        return f"{self.word} {record}: {message}" if record else message

    def _check(self, call: Call) -> Item:
        """The checks a log line gets (`openai_lines.parse_line`), on the call as a log line would hold it."""
        request, response, origin = chat_request(call), call.response, call.origin

        def error(field: str | None, message: str) -> TraceLineError:
            err = line_error(log_line(request, response), self.source, origin.line, field, message)
            return TraceLineError(err.source, err.line, err.field, self._named(origin.record, err.message),
                                  err.excerpt)

        problem = check_request(request)
        if problem:
            return error(*problem)
        if response is not None and not isinstance(response, dict):
            return error("response", f"must be an object, got {type(response).__name__}")
        if self.require_response and response is None:
            return error(origin.response_field, NO_ANSWER) if origin.response_field else error("response",
                                                                                                NO_RESPONSE)
        metadata: dict[str, Any] = request["metadata"]
        session_id = as_key(metadata.get("session_id"))
        if session_id is None:
            return error(DEFAULT_SESSION_KEY, "missing or not a string: cannot tell which session this call "
                                              "belongs to (use --session-key to name another field)")
        explicit = metadata.get("call_index")
        index = None
        if explicit is not None:
            index = as_index(explicit)
            if index is None:
                return error(CALL_INDEX_KEY, f"must be a non-negative integer, got {explicit!r}")
        return RawCall(origin.line, session_id, index, as_key(metadata.get("customer")), request, response,
                       len(self.calls), origin.record)

    # -- TraceSource ------------------------------------------------------------------------------------------
    def units(self, parts: int) -> list[tuple[int, int]]:
        n = len(self.calls)
        parts = max(1, min(parts, n))
        bounds = sorted({n * i // parts for i in range(parts + 1)})
        return list(zip(bounds, bounds[1:])) or [(0, 0)]

    def unit_bytes(self, start: int, end: int) -> int:
        n = max(1, len(self.calls))
        return self.size * end // n - self.size * start // n

    def scan(self, start: int, end: int, stats: TraceStats) -> Iterator[tuple[int, Item]]:
        for position in range(start, end):
            yield position - start + 1, self.calls[position]

    def positions(self, start: int, end: int, scanned: TraceStats) -> int:
        return end - start

    def reread(self, key: int, line: int) -> RawCall:
        return self.calls[key]

    def error_at(self, key: int, line: int, field: str | None, message: str) -> TraceLineError:
        call = self.calls[key]
        err = line_error(log_line(call.request, call.response), self.source, line, field, message)
        return TraceLineError(err.source, err.line, err.field, self._named(call.record, err.message), err.excerpt)

