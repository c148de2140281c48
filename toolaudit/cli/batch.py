"""`toolaudit batch export|import`: replay through the OpenAI Batch format (vLLM run-batch, OpenAI Batch, Ray
Data...) instead of a live engine; a batch run is completed by importing a baseline and a candidate side."""

from __future__ import annotations

import click

from toolaudit.cli.common import (
    db_option,
    example,
    format_option,
    friendly_errors,
    key_options,
    output_options,
    resolve_run,
    run_option,
    schema_dir_or_none,
    shard_option,
)
from toolaudit.cli.show import show_summary


@click.group(epilog=example("toolaudit batch export traces/demo.jsonl --path spec-ngram -o spec.requests.jsonl"))
def batch() -> None:
    """Replay requests as OpenAI Batch files, and store the Batch outputs as a run."""


@batch.command(name="export", epilog=example("toolaudit batch export traces/demo.jsonl --path spec-ngram "
                                             "-o spec.requests.jsonl --calls-per-session 3"))
@click.argument("traces", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--path", "path_name", required=True, help="Decode path whose model and sampling the bodies use.")
@click.option("--paths", "paths_file", type=click.Path(dir_okay=False, exists=True), help="paths.toml.")
@click.option("-o", "--output", "out", required=True, type=click.Path(dir_okay=False),
              help="Batch input file to write (JSONL).")
@click.option("--model", help="Model name for the bodies (default: the path's model; a server may serve it "
              "under another name).")
@click.option("--limit", type=click.IntRange(1), help="Only the first N calls.")
@click.option("--calls-per-session", type=click.IntRange(1), metavar="K", help="Only the first K calls of each "
              "session.")
@format_option
@key_options
@shard_option
@friendly_errors
def export_cmd(traces: tuple[str, ...], path_name: str, paths_file: str | None, out: str, model: str | None,
               limit: int | None, calls_per_session: int | None, trace_format: str, session_key: str,
               customer_key: str, shard) -> None:
    """Write the replay requests of TRACES on one decode path as an OpenAI Batch input file."""
    from toolaudit.replay.batch import export_requests
    from toolaudit.replay.replayer import ReplayOptions

    options = ReplayOptions(traces=list(traces), baseline=path_name, candidate=path_name, paths_file=paths_file,
                            limit=limit, calls_per_session=calls_per_session, session_key=session_key,
                            customer_key=customer_key, trace_format=None if trace_format == "auto" else trace_format,
                            shard=shard.as_dict() if shard else None)
    counts = export_requests(options, out, model)
    click.echo(f"{out}: {counts.requests} requests for path {path_name}"
               + (f" ({counts.bad_lines} unusable trace lines left out)" if counts.bad_lines else ""), err=True)


@batch.command(name="import", epilog=example("toolaudit batch import spec.requests.jsonl spec.results.jsonl --side "
                                             "candidate --path spec-ngram --run nightly-batch --db audit.duckdb"))
@click.argument("requests", type=click.Path(dir_okay=False, exists=True))
@click.argument("results", type=click.Path(dir_okay=False, exists=True))
@click.option("--side", type=click.Choice(["baseline", "candidate"]), required=True,
              help="Which side of the run these results are.")
@click.option("--path", "path_name", required=True, help="Decode path the requests were exported for.")
@click.option("--paths", "paths_file", type=click.Path(dir_okay=False, exists=True), help="paths.toml.")
@run_option(default="a new run", what="Batch run to add this side to:")
@click.option("--run-name", help="Name of a new run.")
@click.option("--schemas", "schema_dir", default="schemas", show_default=True, type=click.Path(file_okay=False),
              help="Folder of <tool>.json schemas that override the request's.")
@db_option
@output_options
@friendly_errors
def import_cmd(requests: str, results: str, side: str, path_name: str, paths_file: str | None, run_ref: str | None,
               run_name: str | None, schema_dir: str, db: str, fmt: str) -> None:
    """Store a Batch output file (RESULTS, for the input file REQUESTS) as one side of a batch run.

    Calls are written once both sides are imported; importing again is idempotent and retries error rows."""
    from toolaudit.analysis.figures import run_summary
    from toolaudit.replay.batch import import_results
    from toolaudit.store import Store

    with Store(db) as store:
        run_id = resolve_run(store, run_ref)
        run_id, c = import_results(store, requests, results, side, path_name, paths_file, run_id, run_name,
                                   schema_dir_or_none(schema_dir))
        click.echo(f"run {run_id} {side}: {c.requests} requests, {c.results} results ({c.result_errors} errors, "
                   f"{c.missing} missing, {c.unknown} unknown custom_ids), {c.paired} calls written "
                   f"({c.error_rows} error rows), {c.already_paired} already paired, {c.waiting} waiting for the "
                   "other side", err=True)
        if c.waiting and not c.paired:
            click.echo(f"next: toolaudit batch import ... --side "
                       f"{'candidate' if side == 'baseline' else 'baseline'} --run {run_id} --db {db}", err=True)
            return
        show_summary(run_summary(store, run_id), fmt, db)
