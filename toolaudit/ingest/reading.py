"""Open a trace file in its format (`open_source`) and read it call by call (`read_trace`, for replay and import).

The format is `--format`'s, else `use_format`'s, else detected from the file's first records (`registry`). Every
format yields the same records; `read_trace` indexes the calls in file order (or takes `call_index`), so a call
is the same `TraceCall` whatever file it came from, and every input record is accounted for in `TraceStats`.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from toolaudit import TraceError
from toolaudit.ingest import registry
from toolaudit.ingest.calls import indexed, rekeyed
from toolaudit.ingest.formats.base import Keys
from toolaudit.ingest.formats.spread import fix_hint
from toolaudit.ingest.held import HeldRecords
from toolaudit.ingest.records import (
    CALL_INDEX_KEY,
    DEFAULT_CUSTOMER_KEY,
    DEFAULT_SESSION_KEY,
    CallIndexer,
    RawCall,
    TraceCall,
    TraceLineError,
    TraceStats,
)
from toolaudit.ingest.sources import Scanned, TraceSource, open_trace

_format_override: contextvars.ContextVar[str | None] = contextvars.ContextVar("trace_format", default=None)


@contextmanager
def use_format(fmt: str | None) -> Iterator[None]:
    """Read every trace file in this block as `fmt` (None: detect), for callers that cannot pass `fmt`."""
    token = _format_override.set(fmt)
    try:
        yield
    finally:
        _format_override.reset(token)


def open_source(path: str | Path, fmt: str | None = None, session_key: str = DEFAULT_SESSION_KEY,
                customer_key: str = DEFAULT_CUSTOMER_KEY, require_response: bool = True,
                logs: tuple[str | Path, ...] = (), sessionless: bool = False) -> TraceSource:
    """The file in `fmt` (None: `use_format`'s, else detected). A whole-file format is read here. `logs`: OTLP/JSON
    logs exports whose records are joined to an OTLP span export's spans (`otlp_logs`). `sessionless`: keep the
    calls without a session (session "", OpenAI logs: see `Keys.sessionless`)."""
    source = str(path)
    open_trace(path).close()
    forced = fmt or _format_override.get()
    known = registry.names()
    if forced is not None and forced not in known:
        raise TraceError(source, None, None, f"unknown format {forced!r} (known: {', '.join(known)})")
    trace_format = registry.get(forced or registry.detect_format(source)[0])
    keys = Keys.from_options(session_key, customer_key, sessionless)
    if trace_format.open is not None:
        opened = trace_format.open(source, keys, require_response, forced is None)
    else:
        opened = HeldRecords.read(source, trace_format, keys, require_response, forced is None)
    for extra in logs:
        if not hasattr(opened, "add_logs"):
            raise TraceError(str(extra), None, None, f"logs files are joined to OTLP span exports only, and {source} "
                                                     f"is read as {trace_format.name}")
        opened.add_logs(str(extra))
    return opened


def check(src: TraceSource, stats: TraceStats, first_errors: list[TraceLineError]) -> None:
    """Raise TraceError when the file held nothing, or no usable call (see `TraceSource.check`); for a JSON array
    or pretty-printed records that the format reads one line at a time, with the one-line fix (`spread.fix_hint`)."""
    try:
        src.check(stats, first_errors, registry.names())
    except TraceError as exc:
        first = min(first_errors, key=lambda e: e.line, default=None)
        hint = fix_hint(src.source, src.fmt, None if first is None else first.message)
        if not hint:
            raise
        raise TraceError(exc.path, exc.line, exc.field, exc.message + hint) from None


def read_trace(
    path: str | Path,
    session_key: str = DEFAULT_SESSION_KEY,
    customer_key: str = DEFAULT_CUSTOMER_KEY,
    require_response: bool = True,
    stats: TraceStats | None = None,
    fmt: str | None = None,
    on_source: Callable[[TraceSource], None] | None = None,
    logs: tuple[str | Path, ...] = (),
) -> Iterator[TraceCall | TraceLineError]:
    """Yield a TraceCall or TraceLineError for every record of `path` (skipped records are only counted).

    `fmt`: a registered format's name; None detects it from the first record (or takes `use_format`'s).
    `on_source` is told how the file is read (format, skipped records and why) before the first item.
    `logs`: OTLP/JSON logs exports joined to an OTLP span export's spans.
    Call order within a session is line order unless `request.metadata.call_index` is given (span formats:
    start time). A second call with the same (session, call index) is an error row: replays must not count a
    call twice. Raises TraceError only for problems with the file as a whole (missing, unreadable, empty, or
    not one usable call in it).
    """
    stats = stats if stats is not None else TraceStats()
    first: list[TraceLineError] = []
    with open_source(path, fmt, session_key, customer_key, require_response, logs) as src:
        if on_source is not None:
            on_source(src)
        if src.preset is not None:
            for name in ("lines", "blank", "records", "skipped"):
                setattr(stats, name, getattr(stats, name) + getattr(src.preset, name))
        for err in src.errors:
            stats.errors += 1
            if len(first) < 3:  # named when the file turns out to hold no usable call
                first.append(err)
            yield err
        indexer = CallIndexer()
        for item in _records(src, stats):
            if isinstance(item, RawCall):
                index = indexer.assign(item.session_id, item.explicit_index, item.line)
                if isinstance(index, str):
                    item = src.error_at(item.key, item.line, CALL_INDEX_KEY, index)
                else:
                    item = TraceCall(src.source, item.line, item.session_id, index, item.customer, item.request,
                                     item.response, item.record)
            if isinstance(item, TraceLineError):
                stats.errors += 1
                if len(first) < 3:
                    first.append(item)
            else:
                stats.calls += 1
            yield item
    check(src, stats, first)


def _records(src: TraceSource, stats: TraceStats) -> Iterator[RawCall | TraceLineError]:
    """The file's records as one range, in order; a settling source's settled (its errors, then its calls)."""
    scanned = Scanned(stats)
    if not src.settles:
        for _, item in src.scan(*src.whole(), scanned):
            yield item
        return
    found = dict(src.scan(*src.whole(), scanned))
    settlement = src.settle([scanned.notes])
    stats.skipped += sum(src.skipped.values())
    yield from settlement.errors
    rekey = settlement.rekey[0] if settlement.rekey else {}
    for _, position in settlement.order:
        call = found[position]
        if position in rekey:
            call = rekeyed(call, *rekey[position])
        yield indexed(call, settlement.keep[0][position])
