"""JSON spread over lines: a file that is one JSON array of records, or pretty-printed documents one after
another. How to tell (`starts_array`, `is_documents`), the first record for detection (`first_element`), and the
one-line fix for readers of one record per line (`one_line_fix`). Reads files only: imports no reader."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from toolaudit.ingest.formats.otlp_docs import first_document, is_pretty

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


def fix_hint(path: str, fmt: str, first_line_error: str | None) -> str:
    """For a file no call could be read from by a reader of one record per line (every format but `openai`, which
    reads such files, `openai_docs.py`) whose first error says a line is not JSON, or a list: when the file is a
    JSON array or pretty-printed records, what it is and the command that writes it one record per line. Else ""."""
    symptoms = ("not valid JSON", "line must be a JSON object, got list")
    if fmt == "openai" or first_line_error is None or not first_line_error.startswith(symptoms):
        return ""
    try:
        if not is_documents(path):
            return ""
        kind = "one JSON array of records" if starts_array(path) else "pretty-printed (records over several lines)"
        return (f". {path} is {kind}, which the {fmt} reader does not read: write it one record per line first: "
                f"{one_line_fix(path)}")
    except OSError:
        return ""


def first_element(path: str | Path, limit: int) -> object | None:
    """The first element of a file that is one JSON array (read up to `limit` bytes), or None."""
    with open(path, "rb") as handle:
        data = handle.read(limit)
    try:
        text = data.decode("utf-8").removeprefix(_BOM)
    except UnicodeDecodeError:
        return None
    at = skip_white(text, 0)
    if text[at:at + 1] != "[":
        return None
    try:
        return _DECODER.raw_decode(text, skip_white(text, at + 1))[0]
    except (ValueError, RecursionError):
        return None


def skip_white(text: str, at: int) -> int:
    """The first position from `at` that is not JSON whitespace."""
    while at < len(text) and text[at] in _WHITE:
        at += 1
    return at
