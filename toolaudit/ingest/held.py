"""A file's calls, checked and held in memory as records (`HeldRecords`), found again by position.

Formats read whole by their reader end here (`TraceFormat.read` returns the whole file's `Conversion`): a
Langfuse export (observations join their traces across lines), a Responses API log, a plug-in's format. Every
call is checked exactly as an OpenAI log line holding it would be (`calls.check_call`), so the records are the
ones an OpenAI log gives, each error row naming the user's file, line, span or observation id and field. Calls
are held in the order a sequential read yields them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from toolaudit.ingest.calls import check_call, error_about, named
from toolaudit.ingest.formats.base import Conversion, Keys
from toolaudit.ingest.formats.contract import TraceFormat
from toolaudit.ingest.records import RawCall, TraceLineError, TraceStats, collector_paused
from toolaudit.ingest.sources import Item, Scanned, TraceSource

CALL_BYTES = 4096  # about what a call takes in an OpenAI log, to size ranges as a log's would be


class HeldRecords(TraceSource):
    """A file's records held in memory: ranges are ranges of positions, keys are positions.

    `calls` are checked records in the order a sequential read yields them (a session's calls by start time),
    each call's `key` its position; `errors` the file's error rows; `preset` its lines, records and skips."""

    def __init__(self, path: str, fmt: str, word: str, calls: list[RawCall], errors: list[TraceLineError],
                 preset: TraceStats, skipped: dict[str, int], detected: bool = True):
        super().__init__(str(path), fmt, detected)
        self.word = word
        self.calls = calls
        self.errors = errors
        self.preset = preset
        self.skipped = skipped
        self.shown = [call.line for call in calls]
        self.size = os.path.getsize(self.source)

    @classmethod
    def read(cls, path: str, fmt: TraceFormat, keys: Keys, require_response: bool = True,
             detected: bool = True) -> HeldRecords:
        """Read `path` whole with `fmt`'s reader (the collector paused: see `collector_paused`)."""
        if fmt.read is None:
            raise ValueError(f"trace format {fmt.name!r} opens its own sources: it is not read whole")
        with collector_paused():
            return cls.from_conversion(str(path), fmt, fmt.read(str(path), keys), require_response, detected)

    @classmethod
    def from_conversion(cls, path: str, fmt: TraceFormat, conv: Conversion, require_response: bool = True,
                        detected: bool = True) -> HeldRecords:
        """A reader's conversion checked into records (problems first, then the calls that fail their check)."""
        word = fmt.record_word
        errors = [TraceLineError(path, p.line, p.field, named(word, p.record, p.message), p.excerpt)
                  for p in conv.problems]
        calls: list[RawCall] = []
        for call in conv.ordered():
            item = check_call(call, path, word, require_response, len(calls))
            (calls if isinstance(item, RawCall) else errors).append(item)
        preset = TraceStats(lines=conv.lines, blank=conv.blank, records=conv.records,
                            skipped=sum(conv.skipped.values()))
        return cls(path, fmt.name, word, calls, errors, preset, dict(conv.skipped), detected)

    # -- TraceSource ------------------------------------------------------------------------------------------
    def units(self, parts: int, budget: int = 0) -> list[tuple[int, int]]:
        n = len(self.calls)
        parts = max(1, min(max(parts, n * CALL_BYTES // budget if budget else parts), n))
        bounds = sorted({n * i // parts for i in range(parts + 1)})
        return list(zip(bounds, bounds[1:])) or [(0, 0)]

    def unit_bytes(self, start: int, end: int) -> int:
        n = max(1, len(self.calls))
        return self.size * end // n - self.size * start // n

    def scan(self, start: int, end: int, scanned: Scanned) -> Iterator[tuple[int, Item]]:
        for position in range(start, end):
            yield position - start + 1, self.calls[position]

    def positions(self, start: int, end: int, scanned: Scanned) -> int:
        return end - start

    def reread(self, key: int, line: int) -> RawCall:
        return self.calls[key]

    def error_at(self, key: int, line: int, field: str | None, message: str) -> TraceLineError:
        return error_about(self.calls[key], self.source, self.word, line, field, message)
