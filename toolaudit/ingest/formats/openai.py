"""OpenAI Chat Completions logs: one `{"request": <chat.completions.create body>, "response": <ChatCompletion>}`
per line, session, customer and call index in `request.metadata` (or where --session-key / --customer-key say).

The log is read where it is: scanned in byte ranges (by worker processes, for compare), a call found again by
its line's byte offset, so memory stays flat however big the log is. It is also the format a file is read as
when no format claims it: its line parser explains what is wrong with each line. A log written as one JSON array
of records, or as pretty-printed records, is read whole instead (`openai_docs.py`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

from toolaudit import TraceError
from toolaudit.ingest.formats.base import Keys
from toolaudit.ingest.formats.contract import Sample, TraceFormat
from toolaudit.ingest.formats.openai_lines import parse_line
from toolaudit.ingest.formats.responses import looks_like_responses
from toolaudit.ingest.records import (
    DEFAULT_CUSTOMER_KEY,
    DEFAULT_SESSION_KEY,
    RawCall,
    TraceLineError,
    line_error,
)
from toolaudit.ingest.sources import Item, RangeLines, Scanned, TraceSource, line_ranges, open_trace


class OpenAILog(TraceSource):
    """An OpenAI log: ranges are byte ranges ending on line boundaries, keys are byte offsets."""

    def __init__(self, path: str, keys: Keys, require_response: bool = True, detected: bool = True):
        super().__init__(str(path), "openai", detected)
        self.session_key = keys.session or DEFAULT_SESSION_KEY
        self.customer_key = keys.customer or DEFAULT_CUSTOMER_KEY
        self.require_response = require_response
        self.sessionless = keys.sessionless
        self._handle: BinaryIO | None = None

    def __getstate__(self) -> dict:  # a worker process started by spawn gets the path, not the open file
        return {**self.__dict__, "_handle": None}

    def units(self, parts: int, budget: int = 0) -> list[tuple[int, int]]:
        return line_ranges(self.source, parts, budget)

    def unit_bytes(self, start: int, end: int) -> int:
        return end - start

    def scan(self, start: int, end: int, scanned: Scanned) -> Iterator[tuple[int, Item]]:
        stats = scanned.stats
        with open_trace(self.source) as handle:
            for line_no, here, raw in RangeLines(handle, start, end, stats):
                stats.records += 1
                yield line_no, parse_line(raw, self.source, line_no, self.session_key, self.customer_key,
                                          self.require_response, here, self.sessionless)

    def positions(self, start: int, end: int, scanned: Scanned) -> int:
        return scanned.stats.lines

    def _line(self, key: int) -> bytes:
        if self._handle is None:
            self._handle = open_trace(self.source)
        self._handle.seek(key)
        return self._handle.readline()

    def reread(self, key: int, line: int) -> RawCall:
        item = parse_line(self._line(key), self.source, line, self.session_key, self.customer_key,
                          self.require_response, key, self.sessionless)
        if not isinstance(item, RawCall):
            raise TraceError(self.source, line, None, "changed while it was read: a line that was a call is not")
        return item

    def error_at(self, key: int, line: int, field: str | None, message: str) -> TraceLineError:
        return line_error(self._line(key), self.source, line, field, message)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def open_log(path: str, keys: Keys, require_response: bool = True, detected: bool = True) -> TraceSource:
    """The log where it is, line by line; a JSON array of records or pretty-printed records read whole."""
    from toolaudit.ingest.formats.openai_docs import read_documents
    from toolaudit.ingest.formats.spread import is_documents

    if is_documents(path):
        return read_documents(str(path), keys, require_response, detected)
    return OpenAILog(path, keys, require_response, detected)


def detect(sample: Sample) -> bool:
    """`{"request": ..., "response": ...}` that is not a Responses API record (nor an OTLP export)."""
    record = sample.value
    return (isinstance(record, dict) and ("request" in record or "response" in record)
            and not isinstance(record.get("resourceSpans"), list) and not looks_like_responses(record))


FORMAT = TraceFormat(
    name="openai", description="OpenAI Chat Completions logs, one {request, response} per line (or one JSON array "
    "of them, or pretty-printed)", detect=detect, open=open_log,
    record_word="line", looks_like="an OpenAI Chat Completions log line")
