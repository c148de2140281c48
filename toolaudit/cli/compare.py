"""`toolaudit compare`: two recorded logs of the same requests, call by call and argument by argument."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import click

from toolaudit.cli.collect import Selected, check_collected, collected_logs, collected_options
from toolaudit.cli.common import (
    Progress,
    Proportion,
    db_option,
    example,
    format_option,
    friendly_errors,
    key_options,
    option_group,
    output_options,
    ray_options,
    ray_settings,
    schema_dir_or_none,
    shard_option,
)
from toolaudit.cli.interrupts import interruptible, watch_store
from toolaudit.cli.show import show_run

if TYPE_CHECKING:
    from toolaudit.compare.job import CompareJob


def _total_bytes(paths: list[str]) -> int:
    return sum(os.path.getsize(p) for p in paths if os.path.isfile(p))


COMPARE_OPTIONS = option_group(
    click.argument("baseline", required=False, type=click.Path(dir_okay=False)),
    click.argument("candidates", nargs=-1, type=click.Path(dir_okay=False)),
    db_option,
    click.option("--run-name", help="A name for this run (default run-<id>); other commands' --run takes it."),
    format_option,
    key_options,
    click.option("--schemas", "schema_dir", default="schemas", show_default=True,
                 type=click.Path(file_okay=False), help="Folder of <tool>.json schemas that override the request's."),
    click.option("--baseline-name", default="baseline", show_default=True, help="Label of the baseline path."),
    click.option("--candidate-name", "candidate_names", multiple=True, help="Label of the candidate path (default "
                 "\"candidate\"); with several candidate logs, one per log in order (default: the file names)."),
    click.option("--workers", type=click.IntRange(1, 64), help="Processes that parse the logs (default: one per core "
                 "for logs over 64 MB, else 1)."),
    click.option("--pair-by", type=click.Choice(["auto", "session", "request"]), default="auto", show_default=True,
                 help="Pair calls by session and call index, or by request (digest of messages, tools and tool "
                      "settings, and occurrence). auto: by request when a log's calls carry no session at the "
                      "session key, or all share one and pairing by it puts different requests together."),
    click.option("--max-mismatched", type=Proportion(), default="0", show_default=True,
                 help="Largest allowed share of paired calls whose two requests differ (stored as mismatched, not "
                      "compared); above it compare exits 1. 0: any mismatch fails (the pairing is then wrong)."),
    shard_option,
    collected_options,
    click.option("--baseline-service", metavar="NAME", help="With --collected: the baseline is the spans of this "
                 "service (resource attribute service.name)."),
    click.option("--candidate-service", "candidate_services", multiple=True, metavar="NAME",
                 help="With --collected: a candidate is the spans of this service; repeat it for a remedy matrix. "
                      "With --sample, every side keeps the sessions drawn from the baseline."),
    ray_options("Scan the logs (parse, digest, validate)", "scan workers, one CPU each; the logs and --schemas must "
                "be on a path every node shares"),
    output_options,
)


@click.command(epilog=example("toolaudit compare baseline.jsonl candidate.jsonl --run-name nightly --db audit.duckdb"))
@COMPARE_OPTIONS
@friendly_errors
@interruptible
def compare(baseline: str | None, candidates: tuple[str, ...], db: str, run_name: str | None, trace_format: str,
            session_key: str, customer_key: str, schema_dir: str, baseline_name: str,
            candidate_names: tuple[str, ...], workers: int | None, pair_by: str, max_mismatched: float, shard,
            collected: str | None, since: str | None, sample: int | None, per_customer: bool, seed: str,
            baseline_service: str | None, candidate_services: tuple[str, ...], ray_address: str | None,
            ray_workers: int | None, fmt: str) -> None:
    """Compare two recorded logs of the same requests, call by call and argument by argument.

    Several candidate logs (`compare BASE A B C`) make a remedy matrix: each compared with the same baseline,
    shown side by side (`toolaudit frontier`, `report`, `check` per candidate).

    Each log may be an OpenAI Chat Completions log, an OTel GenAI or OpenInference export (OTLP/JSON), a
    Langfuse export or a Responses API log: detected from its first record unless --format says.

    Or two deployments that export to one `toolaudit collect`: `compare --collected DIR --baseline-service A
    --candidate-service B`, told apart by their resource attribute service.name."""
    from toolaudit.compare.job import CompareJob
    from toolaudit.compare.logs import CompareOptions

    ray = ray_settings(ray_address, ray_workers)
    if ray is not None and workers is not None:
        raise click.UsageError("--workers counts processes on this machine; with --ray, use --ray-workers")
    check_collected(collected, since, sample, per_customer, seed)
    if collected is not None:
        baseline, candidates, baseline_name, candidate_names = collected_logs(
            baseline, candidates, baseline_name, candidate_names, baseline_service, candidate_services,
            Selected(collected, db, since, sample, per_customer, seed, session_key, customer_key, trace_format))
    elif baseline_service is not None or candidate_services:
        raise click.UsageError("--baseline-service and --candidate-service select from --collected DIR")
    _check_logs(baseline, candidates, candidate_names)
    options = CompareOptions(session_key=session_key, customer_key=customer_key,
                             schema_dir=schema_dir_or_none(schema_dir), run_name=run_name,
                             baseline_name=baseline_name, candidate_name=(candidate_names or ("candidate",))[0],
                             workers=workers, format=None if trace_format == "auto" else trace_format, shard=shard,
                             pair_by=pair_by)
    _run(db, CompareJob(baseline, tuple(candidates), options, tuple(candidate_names), max_mismatched), ray, fmt)


def _check_logs(baseline: str | None, candidates: tuple[str, ...], names: tuple[str, ...]) -> None:
    if baseline is None or not candidates:
        raise click.UsageError("give a baseline log and at least one candidate log (or --collected DIR)")
    if len(names) > 1 and len(names) != len(candidates):
        raise click.UsageError(f"{len(candidates)} candidate logs but {len(names)} --candidate-name")
    _require_logs([baseline, *candidates])


def _run(db: str, job: CompareJob, ray, fmt: str) -> None:
    """Compare into the database with a progress bar, show the run, then what the comparison has to say."""
    from toolaudit.compare.job import run_compare
    from toolaudit.store import Store

    with Store(db) as store:
        watch_store(store)  # Ctrl-C or SIGTERM: `interruptible` says what became of the run
        # readers open a snapshot meanwhile, taken after commits as the throttle allows
        store.publish_snapshots("compare", on_commit=True, on_error=lambda m: click.echo(f"warning: {m}", err=True))
        logs = [job.baseline] * len(job.candidates) + list(job.candidates)  # the baseline is scanned per candidate
        total = _total_bytes(logs) if sys.stderr.isatty() else 0
        with Progress("comparing", total, unit=" bytes") as bar:
            outcome = run_compare(store, job, bar.update if total else None, _scans(ray),
                                  warn=lambda m: click.echo(f"warning: {m}", err=True))
        show_run(store, outcome.run_id, fmt, db)
    for line in outcome.warnings:
        click.echo(f"warning: {line}", err=True)
    for line in outcome.notes:
        click.echo(f"note: {line}", err=True)
    if outcome.problems:
        raise click.ClickException("; ".join(outcome.problems))


def _scans(ray):
    """Where the logs are scanned: a Ray cluster (`--ray`; the rows are written here as in process) or here."""
    if ray is None:
        return None
    from toolaudit.compare.ray_scan import RayScans

    return RayScans(ray)


def _require_logs(logs: list[str]) -> None:
    """A log that is not there is a usage error (exit 2, as a run that is not there), said before a database is
    opened; a log that is there but cannot be read fails while running (exit 1)."""
    from toolaudit import TraceFileNotFound

    for log in logs:
        if not os.path.exists(log):
            raise TraceFileNotFound(log)
