"""An OpenAI log that is not one record per line: one JSON array of `{"request": ..., "response": ...}` records
(`json.dump(records, f)`, with or without `indent`), or records pretty-printed one after another (`jq .`,
`json.dump(record, f, indent=2)` per record). Such a file is read whole and held (`held.HeldRecords`); each record
is checked exactly as a log line holding it (`openai_lines.parse_line`), its error rows naming the file, the line
the record starts on and its number in the file ("... (record 3)"), since several records may share a line.

A line-per-record log is never read here: its first line holds a whole record (`spread.is_documents`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from toolaudit.ingest.formats.base import Keys
from toolaudit.ingest.formats.openai_lines import parse_line
from toolaudit.ingest.formats.spread import skip_white
from toolaudit.ingest.records import (
    DEFAULT_CUSTOMER_KEY,
    DEFAULT_SESSION_KEY,
    RawCall,
    TraceLineError,
    TraceStats,
    collector_paused,
    line_error,
)

_DECODER = json.JSONDecoder()
_BOM = "\ufeff"
_PEEK = 1 << 16


def _records(text: str) -> Iterator[tuple[int, str, str | None]]:
    """(character offset, raw text, error or None) of every record: the elements of a top-level array, or
    top-level objects one after another. Stops at the first text that is not JSON (nothing after it can be found
    again reliably), with an error naming it."""
    at = skip_white(text, 0)
    while at < len(text):
        if text[at] != "[":
            end = yield from _value(text, at)
            if end is None:
                return
            at = skip_white(text, end)
            continue
        at = skip_white(text, at + 1)
        if text[at:at + 1] == "]":
            at = skip_white(text, at + 1)
            continue
        while True:
            end = yield from _value(text, at)
            if end is None:
                return
            at = skip_white(text, end)
            if text[at:at + 1] == ",":
                at = skip_white(text, at + 1)
                continue
            if text[at:at + 1] == "]":
                at = skip_white(text, at + 1)
                break
            yield at, text[at:at + _PEEK], "not valid JSON: expected ',' or ']' after an array element"
            return


def _value(text: str, at: int) -> Iterator[tuple[int, str, str | None]]:
    """Yield the JSON value at `at` as a record (or the error there); return where it ends (None on an error)."""
    try:
        _, end = _DECODER.raw_decode(text, at)
    except (ValueError, RecursionError) as exc:
        yield at, text[at:at + _PEEK], f"not valid JSON: {exc}"
        return None
    yield at, text[at:end], None
    return end


def read_documents(path: str, keys: Keys, require_response: bool, detected: bool):
    """The file's records held in memory as a `HeldRecords` (calls found again by position)."""
    from toolaudit.ingest.held import HeldRecords  # (imports the format registry: not at module import)

    session_key = keys.session or DEFAULT_SESSION_KEY
    customer_key = keys.customer or DEFAULT_CUSTOMER_KEY
    data = Path(path).read_bytes()
    lines = data.splitlines()
    preset = TraceStats(lines=len(lines), blank=sum(1 for one in lines if not one.strip()))
    calls: list[RawCall] = []
    errors: list[TraceLineError] = []
    with collector_paused():
        try:
            text = data.decode("utf-8").removeprefix(_BOM)
        except UnicodeDecodeError as exc:
            errors.append(line_error(data[:_PEEK], path, 1, None, f"invalid UTF-8 at byte {exc.start}"))
            preset.records = 1
            return HeldRecords(path, "openai", "record", calls, errors, preset, {}, detected)
        line, seen = 1, 0
        for number, (start, raw, problem) in enumerate(_records(text), start=1):
            line += text.count("\n", seen, start)
            seen = start
            preset.records += 1
            if problem is not None:
                errors.append(_numbered(line_error(raw.encode(), path, line, None, problem), number))
                continue
            item = parse_line(raw.encode(), path, line, session_key, customer_key, require_response, len(calls),
                              keys.sessionless)
            if isinstance(item, TraceLineError):
                errors.append(_numbered(item, number))
            else:
                calls.append(item)
    return HeldRecords(path, "openai", "record", calls, errors, preset, {}, detected)


def _numbered(err: TraceLineError, number: int) -> TraceLineError:
    return replace(err, message=f"{err.message.removeprefix('line ')} (record {number})")
