"""Plain-text and JSON formatting shared by the CLI and reports (no click here: the library stays CLI-free)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import orjson

__all__ = ["csv_cell", "fmt_cell", "format_table", "json_value", "plain", "to_json"]


def plain(value: Any) -> Any:
    """A database value as JSON/CSV can hold it."""
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    return value


def to_json(value: Any) -> str:
    return orjson.dumps(value, default=plain, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode()


def json_value(value: Any) -> str:
    """A value as one line of JSON (`null`, `true`, `{"a": 1}`), as text output shows JSON-ish data: never Python's
    `None` / `True` / `{'a': 1}`. A string is quoted, as JSON writes it."""
    try:
        return orjson.dumps(value, default=plain, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:  # nested past orjson's 254 levels, or a value JSON cannot hold
        return str(value)


def fmt_cell(value: Any) -> str:
    """A table cell: NULL empty, booleans and nested values (lists, structs, maps) as JSON, floats to 4 digits."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple, dict)):
        return json_value(value)
    return str(plain(value))


def csv_cell(value: Any) -> Any:
    """A CSV cell: NULL empty, booleans and nested values as JSON, numbers in full."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple, dict)):
        return json_value(value)
    return plain(value)


def format_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    if not rows:
        return "(no rows)"
    cells = [[fmt_cell(v) for v in row] for row in rows]
    widths = [max(len(str(c)), *(min(len(r[i]), 60) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(columns, widths)),
             "  ".join("-" * w for w in widths)]
    for row in cells:
        lines.append("  ".join((v if len(v) <= 60 else v[:57] + "...").ljust(w) for v, w in zip(row, widths)))
    return "\n".join(lines)


def more_rows(n: int, what: str, command: str) -> list[str]:
    """The line under a table cut to fit one screen: `and N more WHAT: COMMAND` (none when nothing was cut)."""
    return [f"  and {n} more {what}: {command}"] if n > 0 else []
