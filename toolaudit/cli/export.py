"""`toolaudit export`: the database's tables and views as Parquet or CSV files, for warehouses."""

from __future__ import annotations

import click

from toolaudit.cli.common import db_option, friendly_errors, reading


@click.command(name="export")
@db_option
@click.option("--format", "fmt", type=click.Choice(["parquet", "csv"]), default="parquet", show_default=True,
              help="File format (one file per table and view).")
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Folder to write <table>.<format> files into.")
@click.option("--run", "run_id", type=int, help="Only this run's rows (default: every run).")
@friendly_errors
def export_cmd(db: str, fmt: str, out_dir: str, run_id: int | None) -> None:
    """Export every table and view (calls, outputs, arg_diffs, sessions, the drift views...) as files."""
    from toolaudit.store.export import export_relations

    with reading(db) as store:
        if run_id is not None:
            store.run_row(run_id)  # a clear error for an unknown run
        for path, rows in export_relations(store, out_dir, fmt, run_id):
            click.echo(f"{path}\t{rows} rows")
