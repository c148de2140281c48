"""Read-only commands over the database: `runs`, `summary`, `sql`."""

from __future__ import annotations

import difflib
import re

import click

from toolaudit.cli.common import (
    db_option,
    example,
    first_chunk_note,
    friendly_errors,
    output_options,
    print_rows,
    reading,
    resolve_run,
    run_option,
)
from toolaudit.cli.show import show_run


@click.command(epilog=example("toolaudit runs --db audit.duckdb --json"))
@db_option
@output_options
@friendly_errors
def runs(db: str, fmt: str) -> None:
    """List the runs stored in the database."""
    from toolaudit.store.queries import list_runs

    with reading(db) as store:
        columns, rows = list_runs(store)
    print_rows(columns, rows, fmt)


@click.command(epilog=example("toolaudit summary --run nightly --db audit.duckdb"))
@db_option
@run_option()
@click.option("--all", "all_rows", is_flag=True, help="Every row of every table (per tool, per customer, the "
              "worst example's argument diffs); by default the text fits one screen: a few rows each, then how "
              "many more.")
@output_options
@friendly_errors
def summary(db: str, run_ref: str | None, all_rows: bool, fmt: str) -> None:
    """Summarise a run: drifted calls with a 95% interval, session drift, a row per customer."""

    with reading(db) as store:
        run_id = resolve_run(store, run_ref)
        first_chunk_note(store, run_id, db)
        show_run(store, run_id, fmt, db, all_rows=all_rows)


CONFINED = ("\n`toolaudit sql` reaches nothing but the database (no files, network or extensions, and settings "
            "locked); pass --allow-files to let the query read or write files")


@click.command(epilog=example("toolaudit sql \"FROM argument_drift ORDER BY calls_with_diff DESC LIMIT 10\" "
                             "--db audit.duckdb"))
@click.argument("query")
@db_option
@click.option("--allow-files", is_flag=True, help="Let the query read and write files (read_csv, COPY ... TO, "
              "ATTACH); by default it reaches nothing but the database.")
@output_options
@friendly_errors
def sql(query: str, db: str, allow_files: bool, fmt: str) -> None:
    """Run a SQL query on a read-only connection to the database.

    The query reaches nothing outside the database (no files, network or extensions; settings locked), so a
    query pasted from elsewhere cannot read or overwrite files; --allow-files lifts that."""
    import duckdb

    with reading(db) as store:
        if not allow_files:
            store.confine()
        try:
            columns, rows = store.query(query)
        except duckdb.Error as exc:
            unknown = _unknown_table(store, exc)
            if unknown:
                raise click.ClickException(f"SQL error: {unknown}") from None
            confined = isinstance(exc, duckdb.PermissionException) or "configuration has been locked" in str(exc)
            hint = CONFINED if confined and not allow_files else ""
            raise click.ClickException(f"SQL error: {exc}{hint}") from None
    print_rows(columns, rows, fmt)


_NO_TABLE = re.compile(r"Table with name (\S+) does not exist")


def _unknown_table(store, exc: Exception) -> str | None:
    """A query of a table that is not there, said with the tables and views toolaudit keeps (DuckDB suggests the
    nearest name in its catalog, often a system view like pg_description); the position where DuckDB shows it.
    None for any other error."""
    import duckdb

    from toolaudit.store.queries import catalog

    found = _NO_TABLE.search(str(exc)) if isinstance(exc, duckdb.CatalogException) else None
    if found is None:
        return None
    views, tables = catalog(store)
    text, name = str(exc), found.group(1)
    near = difflib.get_close_matches(name.strip('"').lower(), views + tables, n=1, cutoff=0.75)  # a typo
    guess = f" (did you mean {near[0]}?)" if near else ""
    where = text[text.find("\nLINE "):] if "\nLINE " in text else ""
    return (f"unknown table {name}{guess}; toolaudit's views: {', '.join(views)}; its tables: "
            f"{', '.join(tables)} (columns: docs/schema.md){where}")
