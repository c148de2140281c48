"""Read-only commands over the database: `runs`, `summary`, `sql`."""

from __future__ import annotations

import click

from toolaudit.cli.common import db_option, friendly_errors, output_options, print_rows, reading
from toolaudit.cli.remedies import show_run


@click.command()
@db_option
@output_options
@friendly_errors
def runs(db: str, fmt: str) -> None:
    """List the runs stored in the database."""
    from toolaudit.store.queries import list_runs

    with reading(db) as store:
        columns, rows = list_runs(store)
    print_rows(columns, rows, fmt)


@click.command()
@db_option
@click.option("--run", "run_id", type=int, help="Run id (default: the latest run).")
@output_options
@friendly_errors
def summary(db: str, run_id: int | None, fmt: str) -> None:
    """Summarise a run: drifted calls with a 95% interval, session drift, a row per customer."""

    with reading(db) as store:
        show_run(store, run_id, fmt, db)


@click.command()
@click.argument("query")
@db_option
@output_options
@friendly_errors
def sql(query: str, db: str, fmt: str) -> None:
    """Run a SQL query on a read-only connection to the database."""
    import duckdb


    with reading(db) as store:
        try:
            columns, rows = store.query(query)
        except duckdb.Error as exc:
            raise click.ClickException(f"SQL error: {exc}") from None
    print_rows(columns, rows, fmt)
