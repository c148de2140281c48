"""`toolaudit export`: the database's tables and views as Parquet or CSV files, for warehouses."""

from __future__ import annotations

import click

from toolaudit.cli.common import (
    db_option,
    deprecated_format,
    deprecated_format_option,
    example,
    friendly_errors,
    reading,
    resolve_run,
    run_option,
)

FILE_FORMATS = ("parquet", "csv")


@click.command(name="export", epilog=example("toolaudit export --run nightly --as parquet -o warehouse/ "
                                             "--db audit.duckdb"))
@db_option
@click.option("--as", "as_", type=click.Choice(FILE_FORMATS), help="File format, one file per table and view "
              "(default: parquet).")
@deprecated_format_option
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Folder to write <table>.<format> files into.")
@run_option(default="every run", what="Only this run's rows: run")
@friendly_errors
def export_cmd(db: str, as_: str | None, old_format: tuple[str, ...], out_dir: str, run_ref: str | None) -> None:
    """Export every table and view (calls, outputs, arg_diffs, sessions, the drift views...) as files."""
    from toolaudit.store.export import export_relations

    old = deprecated_format("export", old_format, "--as parquet|csv")
    if old and (len(set(old)) > 1 or old[0] not in FILE_FORMATS):
        raise click.UsageError(f"--format (now --as) takes one of {', '.join(FILE_FORMATS)}, got {', '.join(old)}")
    if old and as_ is not None and old[0] != as_:
        raise click.UsageError(f"--format {old[0]} and --as {as_} disagree; give --as only")
    fmt = as_ or (old[0] if old else "parquet")
    with reading(db) as store:
        run_id = resolve_run(store, run_ref)
        for path, rows in export_relations(store, out_dir, fmt, run_id):
            click.echo(f"{path}\t{rows} rows")
