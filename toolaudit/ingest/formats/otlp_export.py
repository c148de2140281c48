"""An OTLP/JSON export read into held records (`read_export`), for the OTel GenAI and OpenInference readers.

Spans are independent of one another but for two things: a span exported twice (the same trace and span id) is
skipped where it comes again when its content is the same, and is an error there when it is not; and a session's
calls are indexed in start-time order (`startTimeUnixNano`; ties keep file order), sessions in the order their
first call appears. So the export is read in byte ranges of lines (`scan_range`: by worker processes for a big
file, one range in-process for a small one), each range's spans turned into checked calls and compact notes,
and the ranges are then settled together (`settle`): duplicates dropped, call indices given, error rows named at
the user's line. The calls are held in memory (`HeldRecords`): compare scans and re-reads them by position.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from toolaudit.ingest.calls import check_call, named
from toolaudit.ingest.formats.base import Call, Invalid, Keys, canonical_bytes, excerpt, load_line
from toolaudit.ingest.formats.otlp import SpanReader, decode_span, key_values, spans_of
from toolaudit.ingest.held import HeldRecords
from toolaudit.ingest.records import RawCall, TraceLineError, TraceStats, collector_paused
from toolaudit.ingest.registry import mixed
from toolaudit.ingest.sources import line_ranges, open_trace

SPAN_BITS = 20  # where a span is in the file: its line's byte offset << SPAN_BITS | its index among the line's spans
WORD = "span"
PARALLEL_BYTES = 64 << 20  # exports under this size are read in-process
RANGE_BYTES = 16 << 20


class Note(NamedTuple):
    """What settling needs to know of one record of a range (lines and positions relative to the range)."""

    line: int
    position: int | None  # the span's position in the range; None for a line that holds no readable span
    ids: tuple[str, str] | None  # (trace id, span id) of a span that decoded
    digest: bytes | None  # its content, to tell an identical re-export from a conflicting one
    where: int  # where the span is in the file (for an error row's excerpt)
    outcome: str  # "call", "failed" (a call that fails its check), "skip" or "error"
    session: str | None = None  # a call's session...
    start: int | None = None  # ...and start time
    reason: str | None = None  # a skip's reason
    error: TraceLineError | None = None  # an error's row (at the range's line)
    call: RawCall | None = None  # a call that passed its check


@dataclass(frozen=True)
class Export:
    """One export and how to read it (picklable: it travels to worker processes)."""

    path: str
    fmt: str
    reader: SpanReader
    keys: Keys
    require_response: bool


class RangeResult(NamedTuple):
    lines: int
    spans: int
    stats: TraceStats
    notes: list[Note]


def read_export(path: str, fmt: str, reader: SpanReader, keys: Keys, require_response: bool = True,
                detected: bool = True, workers: int | None = None) -> HeldRecords:
    """Read an OTLP/JSON export through one convention's span reader. `workers`: processes reading ranges
    (None: one per core, at most 8, for exports of 64 MB or more; in-process below)."""
    export = Export(str(path), fmt, reader, keys, require_response)
    size = os.path.getsize(export.path)
    if workers is None:
        workers = 1 if size < PARALLEL_BYTES else max(1, min(os.cpu_count() or 1, 8))
    ranges = line_ranges(export.path, workers * 2 if workers > 1 else 1, RANGE_BYTES if workers > 1 else 0)
    with collector_paused():
        if workers <= 1 or len(ranges) <= 1:
            results = [scan_range(export, start, end) for start, end in ranges]
        else:
            ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods()
                                              else "spawn")
            with ctx.Pool(min(workers, len(ranges))) as pool:
                results = pool.starmap(scan_range, [(export, start, end) for start, end in ranges])
        return settle(export, results, detected)


def scan_range(export: Export, start: int, end: int) -> RangeResult:
    """Every span of the lines in [start, end), as notes (lines and positions relative to the range)."""
    stats, notes, position = TraceStats(), [], 0
    with collector_paused(), open_trace(export.path) as handle:
        handle.seek(start)
        offset, line_no = start, 0
        resources: dict[int, dict] = {}
        while offset < end:
            raw = handle.readline()
            if not raw:
                break
            line_no += 1
            here, offset = offset, offset + len(raw)
            stats.lines += 1
            if not raw.strip():
                stats.blank += 1
                continue
            pairs = _pairs(export, raw, line_no, here, notes)
            if pairs is None:
                stats.records += 1
                continue
            resources.clear()
            for index, ((_, r, attrs), span_raw) in enumerate(pairs):
                stats.records += 1
                position += 1
                notes.append(_span(export, span_raw, attrs, r, resources, line_no, position,
                                   here << SPAN_BITS | index))
    return RangeResult(line_no, position, stats, notes)


def _pairs(export: Export, raw: bytes, line: int, offset: int, notes: list[Note]) -> list | None:
    """The (resource, span) pairs of a line, or None after noting why it holds none."""
    doc, error = load_line(raw)
    if error is None and (not isinstance(doc, dict) or not isinstance(doc.get("resourceSpans"), list)):
        error = "not an OTLP/JSON ExportTraceServiceRequest (no \"resourceSpans\" list)" + mixed(doc, export.fmt)
    field = None
    if error is None:
        try:
            return spans_of(doc)
        except Invalid as exc:
            field, error = exc.field, exc.message
    err = TraceLineError(export.path, line, field, error, excerpt(raw))
    notes.append(Note(line, None, None, None, offset << SPAN_BITS, "error", error=err))
    return None


def _span(export: Export, span_raw: Any, attrs: Any, r: int, resources: dict, line: int, position: int,
          where: int) -> Note:
    span_id = span_raw.get("spanId") if isinstance(span_raw, dict) else None
    record = span_id if isinstance(span_id, str) and span_id else None

    def failed(field: str | None, message: str, ids=None, digest=None) -> Note:
        err = TraceLineError(export.path, line, field, named(WORD, record, message), excerpt(span_raw))
        return Note(line, position, ids, digest, where, "error", error=err)

    try:
        if not isinstance(span_raw, dict):
            raise Invalid(None, f"a span must be an object, got {type(span_raw).__name__}")
        if r not in resources:
            resources[r] = key_values(attrs, "resource.attributes")
        span = decode_span(span_raw, resources[r], line, position)
        ids = (span.trace_id, span.span_id)
        digest = hashlib.blake2b(canonical_bytes(span_raw), digest_size=16).digest()
    except Invalid as exc:
        return failed(exc.field, exc.message)
    except RecursionError as exc:
        return failed(None, f"span cannot be read: {exc}")
    try:  # a re-exported span is read too: `settle` drops what it gives
        result = export.reader(span, export.keys)
    except Invalid as exc:
        return failed(exc.field, exc.message, ids, digest)
    except RecursionError as exc:
        return failed(None, f"span cannot be read: {exc}", ids, digest)
    if isinstance(result, str):
        return Note(line, position, ids, digest, where, "skip", reason=result)
    call = check_call(result, export.path, WORD, export.require_response, 0)
    if isinstance(call, RawCall):
        return Note(line, position, ids, digest, where, "call", result.session_id, span.start, call=call)
    return Note(line, position, ids, digest, where, "failed", result.session_id, span.start)


class _Placed(NamedTuple):
    session: str
    start: int
    line: int
    position: int
    note: Note


def settle(export: Export, results: list[RangeResult], detected: bool = True) -> HeldRecords:
    """The ranges together: duplicates dropped, calls ordered and indexed, error rows at the user's lines
    (bad records in file order, then the calls that fail their check, in call order)."""
    seen: dict[tuple[str, str], tuple[int, bytes | None]] = {}
    skipped: Counter = Counter()
    errors: list[TraceLineError] = []
    placed: list[_Placed] = []
    preset = TraceStats()
    line_base = position_base = 0
    for result in results:
        for name in ("lines", "blank", "records"):
            setattr(preset, name, getattr(preset, name) + getattr(result.stats, name))
        for note in result.notes:
            line = note.line + line_base
            if note.ids is not None:
                first = seen.get(note.ids)
                if first is not None:
                    if first[1] == note.digest:
                        skipped["duplicate export of a span"] += 1
                    else:
                        errors.append(_error_at(export, note.where, line, note.ids[1], "spanId", (
                            f"duplicate span id (first at line {first[0]}) with different content")))
                    continue
                seen[note.ids] = (line, note.digest)
            if note.outcome == "skip":
                skipped[note.reason] += 1
            elif note.outcome == "error":
                errors.append(replace(note.error, line=line))
            else:
                placed.append(_Placed(note.session, note.start, line, note.position + position_base, note))
        line_base += result.lines
        position_base += result.spans
    calls: list[RawCall] = []
    for session in _sessions(placed):
        for index, one in enumerate(session):
            if one.note.outcome == "call":
                calls.append(_indexed(one.note.call, one.line, index, len(calls)))
            else:  # its error row as a sequential read tells it: the call's index in its request's metadata
                errors.append(_failed(export, one, index))
    preset.skipped = sum(skipped.values())
    return HeldRecords(export.path, export.fmt, WORD, calls, errors, preset, dict(skipped), detected)


def _sessions(placed: list[_Placed]) -> list[list[_Placed]]:
    """Calls by session, each session's in start-time order (ties: line, then position), sessions in the order
    their first call appears (by line, then that order)."""
    sessions: dict[str, list[_Placed]] = {}
    for one in placed:
        sessions.setdefault(one.session, []).append(one)
    out = sorted(sessions.values(), key=lambda ps: min((p.line, (p.start, p.line, p.position)) for p in ps))
    for session in out:
        session.sort(key=lambda p: (p.start, p.line, p.position))
    return out


def _indexed(call: RawCall, line: int, index: int, key: int) -> RawCall:
    """A checked call at the user's line, with its call index (in its request's metadata too) and its key."""
    metadata = {**call.request["metadata"], "call_index": str(index)}
    return replace(call, line=line, explicit_index=index, key=key, request={**call.request, "metadata": metadata})


def _span_at(export: Export, where: int) -> tuple[Any, Any]:
    """(resource attributes, span) of the span at `where`."""
    offset, index = where >> SPAN_BITS, where & ((1 << SPAN_BITS) - 1)
    with open_trace(export.path) as handle:
        handle.seek(offset)
        doc, _ = load_line(handle.readline())
    (_, _, attrs), span_raw = spans_of(doc)[index]
    return attrs, span_raw


def _error_at(export: Export, where: int, line: int, record: str, field: str, message: str) -> TraceLineError:
    _, span_raw = _span_at(export, where)
    return TraceLineError(export.path, line, field, named(WORD, record, message), excerpt(span_raw))


def _failed(export: Export, one: _Placed, index: int) -> TraceLineError:
    """The error row of a call that failed its check, the call read again with its index (rare)."""
    attrs, span_raw = _span_at(export, one.note.where)
    span = decode_span(span_raw, key_values(attrs, "resource.attributes"), one.line, one.position)
    result = export.reader(span, export.keys)
    assert isinstance(result, Call), "a span that was a call reads as one again"
    found = check_call(replace(result, call_index=str(index)), export.path, WORD, export.require_response, 0)
    assert isinstance(found, TraceLineError), "a call that failed its check fails it again"
    return found
