"""`toolaudit compare`: two recorded logs of the same requests, call by call and argument by argument."""

from __future__ import annotations

import os
import sys

import click

from toolaudit.cli.common import (
    Progress,
    db_option,
    format_option,
    friendly_errors,
    key_options,
    output_options,
    schema_dir_or_none,
    shard_option,
)
from toolaudit.cli.show import show_summary


def _total_bytes(paths: list[str]) -> int:
    return sum(os.path.getsize(p) for p in paths if os.path.isfile(p))


@click.command()
@click.argument("baseline", type=click.Path(dir_okay=False))
@click.argument("candidate", type=click.Path(dir_okay=False))
@db_option
@click.option("--run-name", help="A name for this run (default run-<id>).")
@format_option
@key_options
@click.option("--schemas", "schema_dir", default="schemas", show_default=True,
              type=click.Path(file_okay=False), help="Folder of <tool>.json schemas that override the request's.")
@click.option("--baseline-name", default="baseline", show_default=True, help="Label of the baseline path.")
@click.option("--candidate-name", default="candidate", show_default=True, help="Label of the candidate path.")
@click.option("--workers", type=click.IntRange(1, 64), help="Processes that parse the logs (default: one per core "
              "for logs over 64 MB, else 1).")
@shard_option
@output_options
@friendly_errors
def compare(baseline: str, candidate: str, db: str, run_name: str | None, trace_format: str, session_key: str,
            customer_key: str, schema_dir: str, baseline_name: str, candidate_name: str, workers: int | None,
            shard, fmt: str) -> None:
    """Compare two recorded logs of the same requests, call by call and argument by argument.

    Each log may be an OpenAI Chat Completions log, an OTel GenAI or OpenInference export (OTLP/JSON), a
    Langfuse export or a Responses API log: detected from its first record unless --format says."""
    from toolaudit.compare import CompareOptions, compare_logs
    from toolaudit.figures import run_summary
    from toolaudit.store import Store

    options = CompareOptions(session_key=session_key, customer_key=customer_key,
                             schema_dir=schema_dir_or_none(schema_dir), run_name=run_name,
                             baseline_name=baseline_name, candidate_name=candidate_name, workers=workers,
                             format=None if trace_format == "auto" else trace_format, shard=shard)
    with Store(db) as store:
        total = _total_bytes([baseline, candidate]) if sys.stderr.isatty() else 0
        with Progress("comparing", total, unit=" bytes") as bar:
            run_id, _ = compare_logs(store, baseline, candidate, options, progress=bar.update if total else None)
        show_summary(run_summary(store, run_id), fmt, db)
