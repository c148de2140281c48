"""`toolaudit merge`: combine shard databases (`compare`/`replay --shard K/N`) into one run."""

from __future__ import annotations

import click

from toolaudit.cli.common import db_option, example, friendly_errors, output_options
from toolaudit.cli.show import show_summary


@click.command(epilog=example("toolaudit merge shard-1.duckdb shard-2.duckdb@3 --run-name nightly --db audit.duckdb"))
@click.argument("inputs", nargs=-1, required=True, metavar="SHARD.duckdb[@RUN]...")
@db_option
@click.option("--run-name", help="A name for the merged run (default run-<id>).")
@output_options
@friendly_errors
def merge(inputs: tuple[str, ...], db: str, run_name: str | None, fmt: str) -> None:
    """Merge the shard runs of one comparison or replay into one run of --db.

    Each input is a DuckDB file (its latest run) or FILE@RUN. The runs must agree on decode paths, sources,
    fingerprints and options (the shard aside) and be distinct shards of the same N; the merged run's views,
    `summary`, `report` and `check` equal those of one unsharded run. Merging the same runs into the same --db
    again adds nothing: it shows the run merged before (so a merge that was killed can simply be run again).
    Shards missing from 1..N give a run with status `partial` and a warning."""
    from toolaudit.analysis.figures import run_summary
    from toolaudit.store import Store
    from toolaudit.store.combine import merge_runs

    with Store(db) as store:
        result = merge_runs(store, list(inputs), run_name)
        shards = ", ".join(map(str, result.merged))
        done = "were merged before" if result.already else "merged"
        click.echo(f"shards {shards} of {result.count} {done} into run {result.run_id} ({result.calls} calls)",
                   err=True)
        if result.missing:
            click.echo(f"warning: shards {', '.join(map(str, result.missing))} of {result.count} are missing: "
                       f"run {result.run_id} is partial and describes the merged sessions only", err=True)
        show_summary(run_summary(store, result.run_id), fmt, db)
