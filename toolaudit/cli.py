"""The `toolaudit` command line: a thin layer over the library that turns typed errors into messages."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

import click

from toolaudit import __version__
from toolaudit.errors import ToolauditError
from toolaudit.output import format_table, output_options, pct, print_rows, to_json

CONTEXT = {"help_option_names": ["-h", "--help"]}


def db_option(func: Callable) -> Callable:
    return click.option("--db", "db", envvar="TOOLAUDIT_DB", default="toolaudit.duckdb", show_default=True,
                        type=click.Path(dir_okay=False),
                        help="DuckDB file (or set TOOLAUDIT_DB).")(func)


def friendly_errors(func: Callable) -> Callable:
    """Library errors become one-line messages with exit code 1, never tracebacks."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except ToolauditError as exc:
            raise click.ClickException(str(exc)) from None

    return wrapper


def _count_lines(paths: list[str]) -> int:
    total = 0
    for path in paths:
        try:
            with open(path, "rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    total += chunk.count(b"\n")
        except OSError:
            pass
    return total


class Progress:
    """A click progress bar on a terminal, nothing otherwise (logs and pipes stay clean)."""

    def __init__(self, label: str, length: int):
        self.bar = None
        if sys.stderr.isatty() and length > 0:
            self.bar = click.progressbar(length=length, label=label, file=sys.stderr, show_eta=True,
                                         show_pos=True)

    def __enter__(self) -> Callable[[int], None] | None:
        if self.bar is None:
            return None
        self.bar.__enter__()
        return self.bar.update

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, "--version", prog_name="toolaudit")
def cli() -> None:
    """Measure how often two decode paths produce different tool calls for the same requests."""


@cli.command()
@click.argument("baseline", type=click.Path(dir_okay=False))
@click.argument("candidate", type=click.Path(dir_okay=False))
@db_option
@click.option("--run-name", help="A name for this run (default run-<id>).")
@click.option("--session-key", default="request.metadata.session_id", show_default=True,
              help="Dotted path of the session id in each line.")
@click.option("--customer-key", default="request.metadata.customer", show_default=True,
              help="Dotted path of the customer in each line.")
@click.option("--schemas", "schema_dir", default="schemas", show_default=True,
              type=click.Path(file_okay=False), help="Folder of <tool>.json schemas that override the request's.")
@click.option("--baseline-name", default="baseline", show_default=True, help="Label of the baseline path.")
@click.option("--candidate-name", default="candidate", show_default=True, help="Label of the candidate path.")
@output_options
@friendly_errors
def compare(baseline: str, candidate: str, db: str, run_name: str | None, session_key: str, customer_key: str,
            schema_dir: str, baseline_name: str, candidate_name: str, fmt: str) -> None:
    """Compare two recorded logs of the same requests, call by call and argument by argument."""
    from toolaudit.compare import CompareOptions, compare_logs
    from toolaudit.store import Store
    from toolaudit.summary import run_summary

    options = CompareOptions(session_key=session_key, customer_key=customer_key,
                             schema_dir=schema_dir if os.path.isdir(schema_dir) else None, run_name=run_name,
                             baseline_name=baseline_name, candidate_name=candidate_name)
    with Store(db) as store:
        with Progress("comparing", _count_lines([baseline, candidate]) if sys.stderr.isatty() else 0) as tick:
            run_id, _ = compare_logs(store, baseline, candidate, options, progress=tick)
        show_summary(run_summary(store, run_id), fmt)


@cli.command()
@db_option
@output_options
@friendly_errors
def runs(db: str, fmt: str) -> None:
    """List the runs stored in the database."""
    from toolaudit.store import Store

    with Store(db, read_only=True) as store:
        columns, rows = store.query("""
            SELECT r.run_id, r.name, r.kind, r.status, r.created_at, r.baseline_name, r.candidate_name,
                   count(c.run_id) FILTER (c.match_status = 'matched') AS calls,
                   count(c.run_id) FILTER (c.drifted) AS drifted_calls
            FROM runs r LEFT JOIN calls c USING (run_id)
            GROUP BY ALL ORDER BY r.run_id""")
    print_rows(columns, rows, fmt)


@cli.command()
@db_option
@click.option("--run", "run_id", type=int, help="Run id (default: the latest run).")
@output_options
@friendly_errors
def summary(db: str, run_id: int | None, fmt: str) -> None:
    """Summarise a run: drifted calls with a 95% interval, session drift, a row per customer."""
    from toolaudit.store import Store
    from toolaudit.summary import run_summary

    with Store(db, read_only=True) as store:
        show_summary(run_summary(store, run_id), fmt)


@cli.command()
@click.argument("query")
@db_option
@output_options
@friendly_errors
def sql(query: str, db: str, fmt: str) -> None:
    """Run a SQL query on a read-only connection to the database."""
    import duckdb

    from toolaudit.store import Store

    with Store(db, read_only=True) as store:
        try:
            columns, rows = store.query(query)
        except duckdb.Error as exc:
            raise click.ClickException(f"SQL error: {exc}") from None
    print_rows(columns, rows, fmt)


def show_summary(s: dict, fmt: str) -> None:
    if fmt == "json":
        click.echo(to_json(s))
        return
    if fmt == "csv":
        cols = list(s["customers"][0].keys()) if s["customers"] else ["customer"]
        print_rows(cols, [list(c.values()) for c in s["customers"]], "csv")
        return
    un = s["unmatched_calls"]
    lines = [
        f"run {s['run_id']} ({s['run_name']}, {s['status']}): {s['baseline']} vs {s['candidate']}",
        f"  calls compared        {s['calls']}",
        f"  drifted calls         {s['drifted_calls']} ({pct(s['drift_rate'])}, 95% CI "
        f"{pct(s['ci_low'])}-{pct(s['ci_high'])})",
        f"  exact text matches    {s['exact_text_matches']}",
        f"  drift kinds           " + ", ".join(f"{k}={v}" for k, v in s["drift_kinds"].items()),
        f"  sessions              {s['sessions']} (mean {s['mean_calls_per_session']:.1f} calls)",
        f"  session drift         observed {pct(s['observed_session_drift'])}, "
        f"compounded {pct(s['compounded_session_drift'])}",
        f"  unmatched calls       baseline only {un['baseline_only']}, candidate only {un['candidate_only']}",
        f"  error rows            {s['error_rows']}",
        "",
    ]
    click.echo("\n".join(lines))
    cols = ["customer", "calls", "drifted", "drift", "95% CI", "sessions", "observed", "compounded"]
    rows = [[c["customer"], c["calls"], c["drifted_calls"], pct(c["drift_rate"]),
             f"{pct(c['ci_low'])}-{pct(c['ci_high'])}", c["sessions"], pct(c["observed_session_drift"]),
             pct(c["compounded_session_drift"])] for c in s["customers"]]
    click.echo(format_table(cols, rows))


def main() -> None:  # pragma: no cover
    cli(prog_name="toolaudit")


if __name__ == "__main__":  # pragma: no cover
    main()
