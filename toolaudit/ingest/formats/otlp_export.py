"""An OTLP/JSON export opened as a trace source (`OtlpExport`), for the OTel GenAI and OpenInference readers.

It is scanned like an OpenAI log, in byte ranges of lines (by compare's worker processes, which also digest the
calls they find), and the ranges are then settled together from compact notes each leaves (`settle`): a span
exported twice (the same trace and span id) is skipped where it comes again when its content is the same, and is
an error there when it is not; a session's calls are indexed in start-time order (`startTimeUnixNano`; ties keep
file order), sessions in the order their first call appears. A call is found again by its span's place in the
file; a note that travels back from a worker carries its call as compact JSON (`_pack`), so the parent holds
neither the spans nor parsed calls, and re-reading one (a pair that differs) parses only that call.
"""

from __future__ import annotations

import hashlib
import pickle
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from toolaudit.ingest.calls import check_call, error_about, indexed, named, rekeyed
from toolaudit.ingest.formats.base import Call, Invalid, Keys, canonical_bytes, excerpt, load_line
from toolaudit.ingest.formats.otlp import Span, SpanReader, decode_span, key_values, spans_of
from toolaudit.ingest.formats.otlp_docs import Documents, document_at, is_pretty
from toolaudit.ingest.formats.otlp_logs import LOGS, LogIndex, decode_log, records_of
from toolaudit.ingest.formats.span_family import Context, Family
from toolaudit.ingest.records import RawCall, TraceLineError, collector_paused
from toolaudit.ingest.registry import mixed
from toolaudit.ingest.sources import Item, RangeLines, Scanned, Settlement, TraceSource, line_ranges, open_trace

SPAN_BITS = 20  # a span's key: its line's byte offset << SPAN_BITS | its index among the line's spans
WORD = "span"
EXPORT_BYTES = 2  # an export holds about twice the bytes of an OpenAI log for the same calls (ranges are sized so)
LOG_SKIP = "OTLP log record (its content is read with its span)"
_NO_SESSION = ("missing or not a string on the span, its resource, its parent spans and its trace: cannot tell which "
               "session this call belongs to (use --session-key to name another attribute)")


class Note(NamedTuple):
    """What settling needs to know of one record of a range (lines and positions relative to the range)."""

    line: int
    position: int | None  # the span's position in the range; None for a line that holds no readable span
    ids: tuple[str, str] | None  # (trace id, span id) of a span that decoded
    digest: bytes | None  # its content, to tell an identical re-export from a conflicting one
    key: int  # where the span is in the file
    outcome: str  # "call", "failed" (a call that fails its check), "skip" or "error"
    session: str | None = None  # a call's session...
    start: int | None = None  # ...and start time
    reason: str | None = None  # a skip's reason
    error: TraceLineError | None = None  # an error's row (at the range's line)
    call: Any = None  # a call that passed its check: a RawCall, or packed (`_pack`) once it has travelled
    parent: str | None = None  # the span's parent span id
    context: tuple[str | None, str | None] | None = None  # (session, customer) on the span itself, if either
    customer: str | None = None  # a call's customer as scanned


class RangeNotes:
    """A range's notes; pickled (from a worker) with each call packed as compact JSON."""

    def __init__(self, lines: int, spans: int, notes: list[Note]):
        self.lines, self.spans, self.notes = lines, spans, notes

    def __reduce__(self) -> tuple:
        packed = [n._replace(call=_pack(n.call)) if isinstance(n.call, RawCall) else n for n in self.notes]
        return RangeNotes, (self.lines, self.spans, packed)


def _pack(call: RawCall) -> tuple:
    try:
        body = orjson.dumps((call.request, call.response))
    except TypeError:  # nested past orjson's 254 levels
        body = pickle.dumps((call.request, call.response))
    return (body, call.session_id, call.customer, call.record)


def _unpack(packed: Any, line: int, key: int) -> RawCall:
    if isinstance(packed, RawCall):
        return replace(packed, line=line, key=key)
    body, session_id, customer, record = packed
    request, response = orjson.loads(body) if body[:1] == b"[" else pickle.loads(body)
    return RawCall(line, session_id, None, customer, request, response, key, record)


class _Placed(NamedTuple):
    session: str  # as settled (inherited from the span's parents or its trace when the span has none)
    start: int
    line: int  # the user's line
    position: int  # the span's position in the file
    range: int
    note: Note
    customer: str | None = None  # as settled (spans of a convention that declares its `Context` only)


class OtlpExport(TraceSource):
    """One OTLP/JSON export read through one convention's span reader."""

    settles = True

    def __init__(self, path: str, fmt: str, reader: SpanReader, keys: Keys, require_response: bool = True,
                 detected: bool = True, context: Context | None = None):
        super().__init__(str(path), fmt, detected)
        self.reader, self.keys, self.require_response = reader, keys, require_response
        self.context = context
        self.pretty = is_pretty(self.source)  # documents over many lines each, read as one range
        self.logs = LogIndex()  # log records that carry calls' content, joined to their spans by id
        self.logs.read(self.source)
        self.shown = []
        # key -> (call, the user's line, call index, (session, customer) when settled on after the scan)
        self.kept: dict[int, tuple[Any, int, int, tuple[str, str | None] | None]] = {}

    def add_logs(self, path: str) -> None:
        """Join the log records of another OTLP/JSON file (a collector writes logs to a file of their own)."""
        open_trace(path).close()
        self.logs.read(path)

    # -- one range ---------------------------------------------------------------------------------------------
    def units(self, parts: int, budget: int = 0) -> list[tuple[int, int]]:
        if self.pretty:
            return [(0, Path(self.source).stat().st_size)]
        return line_ranges(self.source, parts, budget * EXPORT_BYTES)

    def unit_bytes(self, start: int, end: int) -> int:
        return end - start

    def positions(self, start: int, end: int, scanned: Scanned) -> int:
        return scanned.notes.spans

    def scan(self, start: int, end: int, scanned: Scanned) -> Iterator[tuple[int, Item]]:
        """The range's calls (keys: where their spans are); everything else is left in `scanned.notes`."""
        stats, notes, position = scanned.stats, [], 0
        with collector_paused(), open_trace(self.source) as handle:
            docs = Documents(self.source, stats) if self.pretty else RangeLines(handle, start, end, stats)
            for line_no, here, raw, *parsed in docs:
                doc, error = parsed if parsed else load_line(raw)
                pairs = self._pairs(doc, error, raw, line_no, here, notes)
                if pairs is None:
                    stats.records += 1
                    continue
                resources: dict[int, dict] = {}
                for index, ((_, r, attrs), span_raw) in enumerate(pairs):
                    stats.records += 1
                    position += 1
                    note = self._span(span_raw, attrs, r, resources, line_no, position, here << SPAN_BITS | index)
                    notes.append(note)
                    if note.call is not None:
                        yield position, note.call
                if isinstance(doc, dict) and isinstance(doc.get(LOGS), list):
                    stats.records += self._log_records(doc, raw, line_no, here, notes)
        scanned.notes = RangeNotes(docs.line_no, position, notes)

    def _pairs(self, doc: Any, error: str | None, raw: bytes, line: int, offset: int,
               notes: list[Note]) -> list | None:
        """The (resource, span) pairs of an export request ([] for a logs export), or None after noting why it
        holds none."""
        if error is None and isinstance(doc, dict) and isinstance(doc.get(LOGS), list) and "resourceSpans" not in doc:
            return []
        if error is None and (not isinstance(doc, dict) or not isinstance(doc.get("resourceSpans"), list)):
            error = "not an OTLP/JSON ExportTraceServiceRequest (no \"resourceSpans\" list)" + mixed(doc, self.fmt)
        field = None
        if error is None:
            try:
                return spans_of(doc)
            except Invalid as exc:
                field, error = exc.field, exc.message
        err = TraceLineError(self.source, line, field, error, excerpt(raw))
        notes.append(Note(line, None, None, None, offset << SPAN_BITS, "error", error=err))
        return None

    def _log_records(self, doc: dict, raw: bytes, line: int, offset: int, notes: list[Note]) -> int:
        """A logs export's records, each skipped (its content was joined to its span) or an error; how many."""
        key = offset << SPAN_BITS
        try:
            records = records_of(doc)
        except Invalid as exc:
            err = TraceLineError(self.source, line, exc.field, exc.message, excerpt(raw))
            notes.append(Note(line, None, None, None, key, "error", error=err))
            return 1
        for record in records:
            try:
                decode_log(record)
            except Invalid as exc:
                err = TraceLineError(self.source, line, exc.field, named("log record", None, exc.message),
                                     excerpt(record))
                notes.append(Note(line, None, None, None, key, "error", error=err))
                continue
            notes.append(Note(line, None, None, None, key, "skip", reason=LOG_SKIP))
        return len(records)

    def _span(self, span_raw: Any, attrs: Any, r: int, resources: dict, line: int, position: int,
              key: int) -> Note:
        span_id = span_raw.get("spanId") if isinstance(span_raw, dict) else None
        record = span_id if isinstance(span_id, str) and span_id else None

        def failed(field: str | None, message: str, ids=None, digest=None) -> Note:
            err = TraceLineError(self.source, line, field, named(WORD, record, message), excerpt(span_raw))
            return Note(line, position, ids, digest, key, "error", error=err)

        try:
            if not isinstance(span_raw, dict):
                raise Invalid(None, f"a span must be an object, got {type(span_raw).__name__}")
            if r not in resources:
                resources[r] = key_values(attrs, "resource.attributes")
            span = decode_span(span_raw, resources[r], line, position)
            if self.logs:
                self.logs.join(span)
            ids = (span.trace_id, span.span_id)
            digest = hashlib.blake2b(canonical_bytes(span_raw), digest_size=16).digest()
        except Invalid as exc:
            return failed(exc.field, exc.message)
        except RecursionError as exc:
            return failed(None, f"span cannot be read: {exc}")
        try:  # a re-exported span is read too: `settle` drops what it gives
            result = self.reader(span, self.keys)
        except Invalid as exc:
            return failed(exc.field, exc.message, ids, digest)
        except RecursionError as exc:
            return failed(None, f"span cannot be read: {exc}", ids, digest)
        context = self._own_context(span)
        if isinstance(result, str):
            return Note(line, position, ids, digest, key, "skip", reason=result, parent=span.parent_id,
                        context=context)
        inherits = False
        if self.context is not None:  # the span's own session, else its trace's id until settling finds one
            session, customer = context or (None, None)
            inherits = session is None
            result = replace(result, session_id=session or span.trace_id, customer=customer)
        elif result.session_id is None:  # a convention without a `Context`: no inheritance
            if self.keys.session is not None:
                return failed(self.keys.session, _NO_SESSION, ids, digest)
            result = replace(result, session_id=span.trace_id)
        call = check_call(result, self.source, WORD, self.require_response, key)
        if isinstance(call, RawCall):
            return Note(line, position, ids, digest, key, "call", result.session_id, span.start,
                        call=replace(call, inherits=inherits), parent=span.parent_id, context=context,
                        customer=result.customer)
        return Note(line, position, ids, digest, key, "failed", result.session_id, span.start,
                    parent=span.parent_id, context=context, customer=result.customer)

    def _own_context(self, span: Span) -> tuple[str | None, str | None] | None:
        return None if self.context is None else self.context.of(span, self.keys)

    # -- the ranges together -----------------------------------------------------------------------------------
    def settle(self, notes: list[Any]) -> Settlement:
        """Duplicates dropped, calls ordered and indexed, error rows at the user's lines (bad records in file
        order, then the calls that fail their check, in call order); `skipped` and `shown` filled in."""
        ranges: list[RangeNotes] = notes
        seen: dict[tuple[str, str], tuple[int, bytes | None]] = {}
        family = Family()
        skipped: Counter = Counter()
        errors: list[TraceLineError] = []
        placed: list[_Placed] = []
        self.shown = []
        line_base = position_base = 0
        for k, range_notes in enumerate(ranges):
            for note in range_notes.notes:
                line = note.line + line_base
                if note.position is not None:
                    self.shown.append(line)
                if note.ids is not None:
                    first = seen.get(note.ids)
                    if first is not None:
                        if first[1] == note.digest:
                            skipped["duplicate export of a span"] += 1
                        else:
                            errors.append(self._error_at_span(note.key, line, note.ids[1], "spanId", (
                                f"duplicate span id (first at line {first[0]}) with different content")))
                        continue
                    seen[note.ids] = (line, note.digest)
                    family.add(note.ids, note.parent, note.context)
                if note.outcome == "skip":
                    skipped[note.reason] += 1
                elif note.outcome == "error":
                    errors.append(replace(note.error, line=line))
                else:
                    placed.append(_Placed(note.session, note.start, line, note.position + position_base, k, note))
            line_base += range_notes.lines
            position_base += range_notes.spans
        self.skipped.clear()
        self.skipped.update(skipped)
        placed, rekey = self._inherit(placed, family, errors, len(ranges))
        keep: list[dict[int, int]] = [{} for _ in ranges]
        order: list[tuple[int, int]] = []
        self.kept = {}
        for session in _sessions(placed):
            for index, one in enumerate(session):
                if one.note.outcome == "call":
                    keep[one.range][one.note.position] = index
                    order.append((one.range, one.note.position))
                    self.kept[one.note.key] = (one.note.call, one.line, index, rekey[one.range].get(one.note.position))
                else:  # its error row as a sequential read tells it: the call's index in its request's metadata
                    errors.append(self._failed(one, index))
        return Settlement(keep, errors, order, rekey)

    def _inherit(self, placed: list[_Placed], family: Family, errors: list[TraceLineError],
                 ranges: int) -> tuple[list[_Placed], list[dict[int, tuple[str, str | None]]]]:
        """Each call's session and customer, from the span, else its parent spans, else any span of its trace
        (the agent span that carries them often ends, and is exported, after the model call's span), else (the
        session) the trace id; a call still without a `--session-key` it was asked for is an error row."""
        rekey: list[dict[int, tuple[str, str | None]]] = [{} for _ in range(ranges)]
        if self.context is None:
            return placed, rekey
        out = []
        for one in placed:
            note = one.note
            session, customer = family.inherited(note.ids, note.parent, note.context)
            if session is None and self.keys.session is not None:
                errors.append(self._error_at_span(note.key, one.line, note.ids[1], self.keys.session,
                                                  _NO_SESSION))
                continue
            session = session or note.ids[0]
            if (session, customer) != (note.session, note.customer):
                rekey[one.range][note.position] = (session, customer)
            out.append(one._replace(session=session, customer=customer))
        return out, rekey

    # -- finding a call again ----------------------------------------------------------------------------------
    def reread(self, key: int, line: int) -> RawCall:
        call, shown, index, settled_on = self.kept[key]
        found = _unpack(call, shown, key)
        return indexed(rekeyed(found, *settled_on) if settled_on else found, index)

    def error_at(self, key: int, line: int, field: str | None, message: str) -> TraceLineError:
        return error_about(self.reread(key, line), self.source, WORD, line, field, message)

    def _span_at(self, key: int) -> tuple[Any, Any]:
        """(resource attributes, span) of the span at `key`: read again from the file (rare: errors only)."""
        offset, index = key >> SPAN_BITS, key & ((1 << SPAN_BITS) - 1)
        if self.pretty:
            doc = document_at(self.source, offset)
        else:
            with open_trace(self.source) as handle:
                handle.seek(offset)
                doc, _ = load_line(handle.readline())
        (_, _, attrs), span_raw = spans_of(doc)[index]
        return attrs, span_raw

    def _error_at_span(self, key: int, line: int, record: str, field: str, message: str) -> TraceLineError:
        _, span_raw = self._span_at(key)
        return TraceLineError(self.source, line, field, named(WORD, record, message), excerpt(span_raw))

    def _failed(self, one: _Placed, index: int) -> TraceLineError:
        """The error row of a call that failed its check, read again with its index (rare)."""
        attrs, span_raw = self._span_at(one.note.key)
        span = decode_span(span_raw, key_values(attrs, "resource.attributes"), one.line, one.position)
        if self.logs:
            self.logs.join(span)
        result = self.reader(span, self.keys)
        assert isinstance(result, Call), "a span that was a call reads as one again"
        if self.context is not None:
            result = replace(result, session_id=one.session, customer=one.customer)
        found = check_call(replace(result, call_index=str(index)), self.source, WORD, self.require_response, 0)
        assert isinstance(found, TraceLineError), "a call that failed its check fails it again"
        return found


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


def open_export(fmt: str, reader: SpanReader, context: Context | None = None):
    """The `open` of a format read through `reader` (see `TraceFormat.open`). With `context`, a call's session and
    customer are the export's (the reader's are replaced): found on the span, else inherited (`Context`)."""

    def open_(path: str, keys: Keys, require_response: bool = True, detected: bool = True) -> OtlpExport:
        return OtlpExport(path, fmt, reader, keys, require_response, detected, context)

    return open_
