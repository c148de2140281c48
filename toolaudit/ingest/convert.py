"""A trace file of any registered format written as an OpenAI Chat Completions log (`toolaudit import`): one
{"request", "response"} line per call, with session, customer, call index and the source record in
request.metadata, so every other command reads the calls the same way whatever format they came in."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from toolaudit.ingest.gaps import CallGaps
from toolaudit.ingest.traces import TraceLineError, TraceSource, TraceStats


@dataclass
class Converted:
    """What a conversion read: counts, the bad records (each names its file, line and field), the calls'
    session and customer gaps, and the source as read (its format, detected or as asked)."""

    stats: TraceStats = field(default_factory=TraceStats)
    errors: list[TraceLineError] = field(default_factory=list)
    gaps: CallGaps = field(default_factory=CallGaps)
    source: TraceSource | None = None


def convert(trace_file: str, out: IO[bytes], session_key: str, customer_key: str, fmt: str | None = None,
            logs: tuple[str, ...] = ()) -> Converted:
    """Write `trace_file`'s calls to `out` as OpenAI-log lines; `logs`: OTLP/JSON logs exports whose records
    carry the calls' content (joined to their spans)."""
    import orjson

    from toolaudit.ingest import deepjson
    from toolaudit.ingest.traces import read_trace

    done, seen = Converted(), []
    for item in read_trace(trace_file, session_key, customer_key, require_response=False, stats=done.stats, fmt=fmt,
                           on_source=seen.append, logs=logs):
        if isinstance(item, TraceLineError):
            done.errors.append(item)
            continue
        done.gaps.add(item.session_id, item.customer, item.request)
        line = _line(item)
        try:
            out.write(orjson.dumps(line) + b"\n")
        except TypeError:  # nested past orjson's 254 levels
            out.write(deepjson.dumps(line, sort_keys=False).encode() + b"\n")
    done.source = seen[0] if seen else None
    return done


def _line(item) -> dict:
    metadata = dict(item.request.get("metadata") or {})
    metadata.update(session_id=item.session_id, call_index=str(item.call_index))
    if item.customer is not None:
        metadata["customer"] = item.customer
    if item.record is not None:
        metadata["source_record"] = item.record
    line = {"request": {**item.request, "metadata": metadata}}
    if item.response is not None:
        line["response"] = item.response
    return line


@contextmanager
def replaced_atomically(target: Path | None, stdout: IO[bytes]) -> Iterator[IO[bytes]]:
    """A handle that becomes `target` only when the block ends without an error (a temporary file beside it,
    then renamed): a failed conversion leaves no half-written log. None: `stdout`."""
    if target is None:
        yield stdout
        stdout.flush()
        return
    handle = tempfile.NamedTemporaryFile("wb", dir=target.resolve().parent, prefix=f".{target.name}.", delete=False)
    try:
        yield handle
    except BaseException:
        handle.close()
        os.unlink(handle.name)
        raise
    handle.close()
    os.replace(handle.name, target)
