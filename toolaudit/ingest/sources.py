"""A trace file opened in its format (`TraceSource`): what `read_trace` iterates and what `compare` scans in
parallel ranges and re-reads.

An OpenAI log (`formats.openai.OpenAILog`) is read where it is: scanned in byte ranges by worker processes, a call
found again by its byte offset, so memory stays flat however big the log is. An OTLP export
(`formats.otlp_export.OtlpExport`) is scanned in byte ranges too, and its ranges settled together afterwards
(re-exported spans, start-time order). A format read whole by its reader (Langfuse joins records across lines; a
plug-in's `read`) is held in memory (`held.HeldRecords`), scanned by ranges of positions and found again by
position. All yield the same records: `RawCall`s and `TraceLineError`s naming the user's file, line, span, field.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from toolaudit import TraceError
from toolaudit.ingest.records import RawCall, TraceLineError, TraceStats

Item = RawCall | TraceLineError


@dataclass
class Scanned:
    """What scanning one range found beside the records it yielded."""

    stats: TraceStats = field(default_factory=TraceStats)  # lines, blank lines, records of a source read as it goes
    notes: Any = None  # a settling source's notes on the range (picklable: they come back from a worker)


@dataclass
class Settlement:
    """How a settling source's ranges fit together, decided once every range is scanned."""

    keep: list[dict[int, int]]  # per range: the position of each call that stays -> its call index
    errors: list[TraceLineError]  # the file's error rows at the user's lines, in the order a sequential read gives
    order: list[tuple[int, int]]  # (range, position) of the calls that stay, in the order a sequential read gives
    # per range: position -> (session, customer) of the calls whose session or customer was settled on after they
    # were scanned (a span that inherits them from its parent spans); apply with `calls.rekeyed`
    rekey: list[dict[int, tuple[str, str | None]]] = field(default_factory=list)


SMALL = 1 << 20  # files under this size are one range


class RangeLines:
    """The lines of one byte range of an open file, as a line-based scan reads them: every line and every blank
    one is counted in `stats`, the others are yielded as (line number within the range, byte offset, raw);
    after the loop `line_no` is the range's line count."""

    def __init__(self, handle: BinaryIO, start: int, end: int, stats: TraceStats):
        self.handle, self.start, self.end, self.stats = handle, start, end, stats
        self.line_no = 0

    def __iter__(self) -> Iterator[tuple[int, int, bytes]]:
        self.handle.seek(self.start)
        offset = self.start
        while offset < self.end:
            raw = self.handle.readline()
            if not raw:
                break
            self.line_no += 1
            here, offset = offset, offset + len(raw)
            self.stats.lines += 1
            if not raw.strip():
                self.stats.blank += 1
                continue
            yield self.line_no, here, raw


def line_ranges(path: str, parts: int, budget: int = 0) -> list[tuple[int, int]]:
    """Byte ranges of a file that end on line boundaries: about `parts`, more when needed for none to be much
    larger than `budget` bytes (0: no bound); one range for a small file."""
    size = Path(path).stat().st_size
    parts = max(parts, size // budget) if budget else parts
    if parts <= 1 or size < SMALL:
        return [(0, size)]
    bounds = [0]
    with open_trace(path) as handle:
        for i in range(1, parts):
            handle.seek(max(bounds[-1], size * i // parts))
            handle.readline()
            pos = handle.tell()
            if pos < size and pos > bounds[-1]:
                bounds.append(pos)
    bounds.append(size)
    return list(zip(bounds, bounds[1:]))


def open_trace(path: str | Path) -> BinaryIO:
    """The file opened for reading, or a TraceError that says why it cannot be."""
    try:
        return Path(path).open("rb")
    except OSError as exc:
        raise TraceError(str(path), None, None, f"cannot open trace file: {exc.strerror or exc}") from None


class TraceSource(ABC):
    """One trace file in one format.

    `errors` holds the error rows known when the file is opened (a whole-file reader's bad records) and
    `preset` its accounting of lines and records; a log scanned in ranges finds both while it is scanned.
    `shown[p - 1]` is the user's line of position p for sources whose positions are not lines (None: they are).

    A source that `settles` cannot decide everything about a range alone (an OTLP export: a span exported twice
    is skipped only where it comes again, and a session's calls are indexed by start time across the file): its
    ranges yield the calls they hold and leave notes, and `settle` decides, once every range is scanned, which
    calls stay, their call indices, the file's error rows, skipped records and `shown` lines.
    """

    settles = False

    def __init__(self, source: str, fmt: str, detected: bool):
        self.source = source
        self.fmt = fmt  # the format's registered name
        self.detected = detected
        self.errors: list[TraceLineError] = []
        self.preset: TraceStats | None = None
        self.skipped: dict[str, int] = {}
        self.shown: list[int] | None = None

    # -- scanning -------------------------------------------------------------------------------------------
    @abstractmethod
    def units(self, parts: int, budget: int = 0) -> list[tuple[int, int]]:
        """At least about `parts` ranges that together cover the source, in order (byte ranges, position ranges);
        more when needed for none to hold much more than `budget` bytes of an OpenAI log (0: no bound), so that
        one range's digests stay small."""

    @abstractmethod
    def unit_bytes(self, start: int, end: int) -> int:
        """How many bytes of the user's file a range stands for (progress is counted in bytes)."""

    @abstractmethod
    def scan(self, start: int, end: int, scanned: Scanned) -> Iterator[tuple[int, Item]]:
        """(position within the range, counted from 1, record) for every record of a range. Error rows found here
        carry lines relative to the range (a settling source leaves them, and its notes, in `scanned`).
        `scanned.stats` counts the range's lines, blank lines and records when the source reads lines as it goes."""

    @abstractmethod
    def positions(self, start: int, end: int, scanned: Scanned) -> int:
        """How many positions a range held, once scanned (a log's lines, blank ones included)."""

    def settle(self, notes: list[Any]) -> Settlement:
        """Decide what the ranges hold, from every range's notes in order (sources that `settle` only)."""
        raise NotImplementedError(f"{type(self).__name__} does not settle its ranges")

    def whole(self) -> tuple[int, int]:
        """The one range that covers the source."""
        (unit,) = self.units(1)
        return unit

    # -- finding a call again -------------------------------------------------------------------------------
    @abstractmethod
    def reread(self, key: int, line: int) -> RawCall:
        """The call that was scanned with this `key` (`line`: the position it was scanned at)."""

    @abstractmethod
    def error_at(self, key: int, line: int, field: str | None, message: str) -> TraceLineError:
        """An error row about the call scanned with this `key` (a duplicate call index), at the user's `line`."""

    def close(self) -> None:  # noqa: B027 (most sources hold nothing to release)
        """Release what re-reading holds (an open file)."""

    def __enter__(self) -> TraceSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the file as a whole --------------------------------------------------------------------------------
    def check(self, stats: TraceStats, first_errors: list[TraceLineError], known: list[str]) -> None:
        """Raise when the file held nothing, or no usable call: a run over it would measure nothing.
        `known`: the format names to offer."""
        if stats.lines == stats.blank:
            raise TraceError(self.source, None, None, "file is empty: expected one JSON object per line")
        if stats.calls == 0:
            raise TraceError(self.source, None, None, self.no_calls_message(stats, first_errors, known))

    def no_calls_message(self, stats: TraceStats, first_errors: list[TraceLineError], known: list[str]) -> str:
        parts = []
        if stats.errors:
            shown = "; ".join(f"line {e.line}: {e.field + ': ' if e.field else ''}{e.message}"
                              for e in sorted(first_errors, key=lambda e: e.line)[:3])
            parts.append(f"every record failed ({stats.errors} error rows; first: {shown})")
        if stats.skipped:
            top = sorted(self.skipped.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
            parts.append(f"{stats.skipped} records skipped as not model calls ("
                         + ", ".join(f"{n} {reason}" for reason, n in top) + ")")
        how = "detected" if self.detected else "as asked"
        return (f"no usable calls: {'; '.join(parts) or 'no records'}. Read as {self.fmt} ({how}; formats: "
                f"{', '.join(known)}: use --format to choose)")
