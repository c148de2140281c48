"""The export requests of an OTLP/JSON file, whichever way it was written: one per line (a collector's file
exporter), or pretty-printed documents spanning many lines each (`json.dump(..., indent=2)` of one
ExportTraceServiceRequest, or of several one after another).

A line-per-request file is scanned in byte ranges (`sources.RangeLines`); a pretty-printed one is read whole as
one range (`Documents`), each document found by its character offset and named by its first line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from toolaudit.ingest.records import TraceStats

_DECODER = json.JSONDecoder()
_BOM = b"\xef\xbb\xbf"


def _text(data: bytes) -> str:
    """The file as text, a leading byte order mark read as a space: offsets (in characters) stay the same."""
    text = data.decode("utf-8")
    return " " + text[1:] if text[:1] == "\ufeff" else text
_PEEK = 1 << 16


def is_pretty(path: str | Path) -> bool:
    """Whether the file's first non-blank line is a lone `{`: what `json.dump(..., indent=N)` and `jq` write. (A
    line-per-request file's first line holds a whole request; a truncated one stays an error of that line.)"""
    with open(path, "rb") as handle:
        for raw in handle:
            if raw.strip():
                return raw.strip().removeprefix(_BOM).strip() == b"{"
    return False


def first_document(path: str | Path, limit: int) -> object | None:
    """The first pretty-printed document of a file (read up to `limit` bytes), or None when there is none."""
    with open(path, "rb") as handle:
        data = handle.read(limit)
    try:
        text = _text(data)
        start = len(text) - len(text.lstrip())
        return _DECODER.raw_decode(text, start)[0]
    except (UnicodeDecodeError, ValueError):
        return None


class Documents:
    """The documents of a pretty-printed file as (first line, offset, raw text, value or None, error or None);
    every line and blank line is counted in `stats`, and `line_no` is the file's line count afterwards."""

    def __init__(self, path: str, stats: TraceStats):
        self.path, self.stats = path, stats
        self.line_no = 0

    def __iter__(self) -> Iterator[tuple[int, int, bytes, object, str | None]]:
        data = Path(self.path).read_bytes()
        lines = data.splitlines()
        self.line_no = len(lines)
        self.stats.lines += len(lines)
        self.stats.blank += sum(1 for line in lines if not line.strip())
        try:
            text = _text(data)
        except UnicodeDecodeError as exc:
            yield 1, 0, data[:_PEEK], None, f"invalid UTF-8 at byte {exc.start}"
            return
        at, line = 0, 1
        while True:
            start = len(text) - len(text[at:].lstrip()) if at < len(text) else at
            if start >= len(text):
                return
            line += text.count("\n", at, start)
            try:
                value, end = _DECODER.raw_decode(text, start)
            except ValueError as exc:
                yield line, start, text[start:start + _PEEK].encode(), None, f"not valid JSON: {exc}"
                return
            yield line, start, text[start:end].encode(), value, None
            line += text.count("\n", start, end)
            at = end


def document_at(path: str, offset: int) -> object:
    """The pretty-printed document that starts at character `offset` (found again for an error row)."""
    return _DECODER.raw_decode(_text(Path(path).read_bytes()), offset)[0]
