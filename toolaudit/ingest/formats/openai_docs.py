"""An OpenAI log that is not one record per line: one JSON array of `{"request": ..., "response": ...}` records
(`json.dump(records, f)`, with or without `indent`), or records pretty-printed one after another (`jq .`,
`json.dump(record, f, indent=2)` per record). Such a file is read whole and held (`held.HeldRecords`); each record
is checked exactly as a log line holding it (`openai_lines.parse_line`), its error rows naming the file, the line
the record starts on and its number in the file ("... (record 3)"), since several records may share a line.

A line-per-record log is never read here: its first line holds a whole record (`is_documents`).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from toolaudit.ingest.formats.base import Keys
from toolaudit.ingest.formats.openai_lines import parse_line
from toolaudit.ingest.formats.otlp_docs import first_document, is_pretty
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
_FIRST = 64 << 20  # how far the first pretty-printed record is looked for
_WHITE = " \t\r\n"
FIX = "jq -c '.[]' {path} > {out}"  # a JSON array as one record per line
FIX_PRETTY = "jq -c . {path} > {out}"  # pretty-printed records as one per line


def starts_array(path: str | Path) -> bool:
    """Whether the file is a JSON array of objects: its first non-blank character `[`, the next one `{` (or `]`).
    (A log line that is an array of numbers stays an error of that line.)"""
    with open(path, "rb") as handle:
        head = handle.read(_PEEK)
    text = head.removeprefix(b"\xef\xbb\xbf").lstrip()
    return text[:1] == b"[" and text[1:].lstrip()[:1] in (b"{", b"]")


def is_documents(path: str | Path) -> bool:
    """A JSON array of records, or pretty-printed records: the first non-blank line a lone `{` that opens a whole
    JSON document (a log whose first line is a truncated record `{` stays a log: its lines are its records)."""
    return starts_array(path) or (is_pretty(path) and first_document(path, _FIRST) is not None)


def one_line_fix(path: str) -> str:
    """The command that rewrites the file as one record per line (into a new file beside it)."""
    target = Path(path).with_suffix(".jsonl")
    if target == Path(path):
        target = Path(path).with_suffix(".lines.jsonl")
    return (FIX if starts_array(path) else FIX_PRETTY).format(path=shlex.quote(path), out=shlex.quote(str(target)))


def first_element(path: str | Path, limit: int) -> object | None:
    """The first element of a file that is one JSON array (read up to `limit` bytes), or None."""
    with open(path, "rb") as handle:
        data = handle.read(limit)
    try:
        text = data.decode("utf-8").removeprefix(_BOM)
    except UnicodeDecodeError:
        return None
    at = _skip(text, 0)
    if text[at:at + 1] != "[":
        return None
    try:
        return _DECODER.raw_decode(text, _skip(text, at + 1))[0]
    except (ValueError, RecursionError):
        return None


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at] in _WHITE:
        at += 1
    return at


def _records(text: str) -> Iterator[tuple[int, str, str | None]]:
    """(character offset, raw text, error or None) of every record: the elements of a top-level array, or
    top-level objects one after another. Stops at the first text that is not JSON (nothing after it can be found
    again reliably), with an error naming it."""
    at = _skip(text, 0)
    while at < len(text):
        if text[at] == "[":
            at = _skip(text, at + 1)
            if text[at:at + 1] == "]":
                at = _skip(text, at + 1)
                continue
            while True:
                try:
                    _, end = _DECODER.raw_decode(text, at)
                except (ValueError, RecursionError) as exc:
                    yield at, text[at:at + _PEEK], f"not valid JSON: {exc}"
                    return
                yield at, text[at:end], None
                at = _skip(text, end)
                if text[at:at + 1] == ",":
                    at = _skip(text, at + 1)
                    continue
                if text[at:at + 1] == "]":
                    at = _skip(text, at + 1)
                    break
                yield at, text[at:at + _PEEK], "not valid JSON: expected ',' or ']' after an array element"
                return
            continue
        try:
            _, end = _DECODER.raw_decode(text, at)
        except (ValueError, RecursionError) as exc:
            yield at, text[at:at + _PEEK], f"not valid JSON: {exc}"
            return
        yield at, text[at:end], None
        at = _skip(text, end)


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
            item = parse_line(raw.encode(), path, line, session_key, customer_key, require_response, len(calls))
            if isinstance(item, TraceLineError):
                errors.append(_numbered(item, number))
            else:
                calls.append(item)
    return HeldRecords(path, "openai", "record", calls, errors, preset, {}, detected)


def _numbered(err: TraceLineError, number: int) -> TraceLineError:
    return replace(err, message=f"{err.message.removeprefix('line ')} (record {number})")
