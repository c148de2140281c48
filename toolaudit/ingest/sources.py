"""A trace file opened in its format (`TraceSource`): what `read_trace` iterates and what `compare` scans in
parallel ranges and re-reads.

Two kinds exist. An OpenAI log (`formats.openai.OpenAILog`) is read where it is: scanned in byte ranges by worker
processes, a call found again by its byte offset, so memory stays flat however big the log is. A format whose
calls need the whole file (spans arrive unordered; Langfuse joins records across lines) is read into records
held in memory (`held.HeldRecords`), scanned by ranges of positions and found again by position. Both yield the
same records: `RawCall`s and `TraceLineError`s that name the user's file, line, span and field.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from toolaudit import TraceError
from toolaudit.ingest.records import RawCall, TraceLineError, TraceStats

Item = RawCall | TraceLineError


SMALL = 1 << 20  # files under this size are one range


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
    """

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
    def scan(self, start: int, end: int, stats: TraceStats) -> Iterator[tuple[int, Item]]:
        """(position within the range, counted from 1, record) for every record of a range. Error rows found here
        carry lines relative to the range. `stats` counts the range's lines, blank lines and records when the
        source reads lines as it goes."""

    @abstractmethod
    def positions(self, start: int, end: int, scanned: TraceStats) -> int:
        """How many positions a range held, once scanned into `scanned` (a log's lines, blank ones included)."""

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
