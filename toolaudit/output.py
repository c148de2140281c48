"""Shared output options for reporting commands: a table for people, --json / --csv for machines."""

from __future__ import annotations

import csv
import datetime as dt
import functools
import sys
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

import click
import orjson


def output_options(func: Callable) -> Callable:
    """Adds --json and --csv; the command returns (columns, rows) or a dict and this prints it."""

    @click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
    @click.option("--csv", "as_csv", is_flag=True, help="Print CSV instead of a table.")
    @functools.wraps(func)
    def wrapper(*args: Any, as_json: bool, as_csv: bool, **kwargs: Any) -> None:
        if as_json and as_csv:
            raise click.UsageError("--json and --csv cannot be used together")
        kwargs["fmt"] = "json" if as_json else "csv" if as_csv else "table"
        func(*args, **kwargs)

    return wrapper


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    return value


def to_json(value: Any) -> str:
    return orjson.dumps(value, default=_plain, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode()


def print_rows(columns: Sequence[str], rows: Sequence[Sequence[Any]], fmt: str) -> None:
    """Print query-shaped results; `[]` for JSON when there are none."""
    if fmt == "json":
        click.echo(to_json([dict(zip(columns, map(_plain, row))) for row in rows]))
    elif fmt == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([[_plain(v) for v in row] for row in rows])
    else:
        click.echo(format_table(columns, rows))


def fmt_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(_plain(value))


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


def pct(p: float | None) -> str:
    return "-" if p is None else f"{100 * p:.2f}%"
