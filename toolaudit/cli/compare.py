"""`toolaudit compare`: two recorded logs of the same requests, call by call and argument by argument."""

from __future__ import annotations

import os
import sys

import click

from toolaudit.cli.collect import check_collected, collected_options, select
from toolaudit.cli.common import (
    Progress,
    Proportion,
    db_option,
    example,
    format_option,
    friendly_errors,
    key_options,
    output_options,
    ray_options,
    ray_settings,
    schema_dir_or_none,
    shard_option,
)
from toolaudit.cli.interrupts import interruptible, watch_store
from toolaudit.cli.remedies import show_run


def _total_bytes(paths: list[str]) -> int:
    return sum(os.path.getsize(p) for p in paths if os.path.isfile(p))


@click.command(epilog=example("toolaudit compare baseline.jsonl candidate.jsonl --run-name nightly --db audit.duckdb"))
@click.argument("baseline", required=False, type=click.Path(dir_okay=False))
@click.argument("candidates", nargs=-1, type=click.Path(dir_okay=False))
@db_option
@click.option("--run-name", help="A name for this run (default run-<id>); other commands' --run takes it.")
@format_option
@key_options
@click.option("--schemas", "schema_dir", default="schemas", show_default=True,
              type=click.Path(file_okay=False), help="Folder of <tool>.json schemas that override the request's.")
@click.option("--baseline-name", default="baseline", show_default=True, help="Label of the baseline path.")
@click.option("--candidate-name", "candidate_names", multiple=True, help="Label of the candidate path (default "
              "\"candidate\"); with several candidate logs, one per log in order (default: the file names).")
@click.option("--workers", type=click.IntRange(1, 64), help="Processes that parse the logs (default: one per core "
              "for logs over 64 MB, else 1).")
@click.option("--pair-by", type=click.Choice(["auto", "session", "request"]), default="auto", show_default=True,
              help="Pair calls by session and call index, or by request (digest of messages, tools and tool "
                   "settings, and occurrence). auto: by request when a log's calls carry no session at the "
                   "session key, or all share one and pairing by it puts different requests together.")
@click.option("--max-mismatched", type=Proportion(), default="0", show_default=True,
              help="Largest allowed share of paired calls whose two requests differ (stored as mismatched, not "
                   "compared); above it compare exits 1. 0: any mismatch fails (the pairing is then wrong).")
@shard_option
@collected_options
@click.option("--baseline-service", metavar="NAME", help="With --collected: the baseline is the spans of this "
              "service (resource attribute service.name).")
@click.option("--candidate-service", "candidate_services", multiple=True, metavar="NAME",
              help="With --collected: a candidate is the spans of this service; repeat it for a remedy matrix. "
                   "With --sample, every side keeps the sessions drawn from the baseline.")
@ray_options("Scan the logs (parse, digest, validate)", "scan workers, one CPU each; the logs and --schemas must "
             "be on a path every node shares")
@output_options
@friendly_errors
@interruptible
def compare(baseline: str | None, candidates: tuple[str, ...], db: str, run_name: str | None, trace_format: str,
            session_key: str, customer_key: str, schema_dir: str, baseline_name: str,
            candidate_names: tuple[str, ...], workers: int | None, pair_by: str, max_mismatched: float, shard,
            collected: str | None,
            since: str | None, sample: int | None, per_customer: bool, seed: str, baseline_service: str | None,
            candidate_services: tuple[str, ...], ray_address: str | None, ray_workers: int | None,
            fmt: str) -> None:
    """Compare two recorded logs of the same requests, call by call and argument by argument.

    Several candidate logs (`compare BASE A B C`) make a remedy matrix: each compared with the same baseline,
    shown side by side (`toolaudit frontier`, `report`, `check` per candidate).

    Each log may be an OpenAI Chat Completions log, an OTel GenAI or OpenInference export (OTLP/JSON), a
    Langfuse export or a Responses API log: detected from its first record unless --format says.

    Or two deployments that export to one `toolaudit collect`: `compare --collected DIR --baseline-service A
    --candidate-service B`, told apart by their resource attribute service.name."""
    from toolaudit.compare.coverage import mismatch_problem, pairing_problem
    from toolaudit.compare.logs import CompareOptions, compare_logs
    from toolaudit.compare.matrix import compare_matrix, default_names
    from toolaudit.ingest.gaps import gap_warnings
    from toolaudit.store import Store

    ray = ray_settings(ray_address, ray_workers)
    if ray is not None and workers is not None:
        raise click.UsageError("--workers counts processes on this machine; with --ray, use --ray-workers")
    check_collected(collected, since, sample, per_customer, seed)
    if collected is not None:
        if baseline is not None or candidates:
            raise click.UsageError("give two logs or --collected DIR, not both")
        if baseline_service is None or not candidate_services:
            raise click.UsageError("--collected needs --baseline-service and --candidate-service (service.name)")
        base = select(collected, db, "baseline", since, sample, per_customer, seed, session_key, customer_key,
                      trace_format, service=baseline_service)
        drawn = frozenset(base.sessions) if sample is not None else None
        baseline = str(base.path)
        candidates = tuple(str(select(collected, db, f"candidate{k + 1}", since, None, False, "", session_key,
                                      customer_key, trace_format, service=service, sessions=drawn).path)
                           for k, service in enumerate(candidate_services))
        if baseline_name == "baseline":
            baseline_name = baseline_service
        candidate_names = candidate_names or candidate_services
    elif baseline_service is not None or candidate_services:
        raise click.UsageError("--baseline-service and --candidate-service select from --collected DIR")
    elif baseline is None or not candidates:
        raise click.UsageError("give a baseline log and at least one candidate log (or --collected DIR)")
    if len(candidate_names) > 1 and len(candidate_names) != len(candidates):
        raise click.UsageError(f"{len(candidates)} candidate logs but {len(candidate_names)} --candidate-name")
    _require_logs([baseline, *candidates])
    options = CompareOptions(session_key=session_key, customer_key=customer_key,
                             schema_dir=schema_dir_or_none(schema_dir), run_name=run_name,
                             baseline_name=baseline_name, candidate_name=(candidate_names or ("candidate",))[0],
                             workers=workers, format=None if trace_format == "auto" else trace_format, shard=shard,
                             pair_by=pair_by)
    temperature = _recorded_temperature([baseline, *candidates], session_key, customer_key, options.format)
    scans = None
    if ray is not None:  # the scans on a Ray cluster; the rows are written here as in process
        from toolaudit.compare.ray_scan import RayScans

        scans = RayScans(ray)
    with Store(db) as store:
        watch_store(store)  # Ctrl-C or SIGTERM: `interruptible` says what became of the run
        # readers open a snapshot meanwhile, taken after commits as the throttle allows
        store.publish_snapshots("compare", on_commit=True,
                                on_error=lambda message: click.echo(f"warning: {message}", err=True))
        # the baseline is scanned once per candidate
        total = _total_bytes([baseline] * len(candidates) + list(candidates)) if sys.stderr.isatty() else 0
        with Progress("comparing", total, unit=" bytes") as bar:
            if len(candidates) == 1:
                run_id, counts = compare_logs(store, baseline, candidates[0], options,
                                              progress=bar.update if total else None, scans=scans)
                runs = {options.candidate_name: counts}
            else:
                names = list(candidate_names) if candidate_names else default_names(list(candidates))
                run_id, per_candidate = compare_matrix(store, baseline, list(candidates), names, options,
                                                       progress=bar.update if total else None, scans=scans)
                runs = {name: counts for name, (_, counts) in per_candidate.items()}
        if temperature:
            for rid in [run_id, *(m["run_id"] for m in store.matrix_members(run_id))]:
                store.update_options(rid, {"request_temperature": temperature})
        show_run(store, run_id, fmt, db)
    for name, counts in runs.items():
        for side, path in (("baseline", baseline), ("candidate", candidates[list(runs).index(name)])):
            if side == "baseline" and name != next(iter(runs)):
                continue  # the baseline is the same file for every candidate: said once
            for warning in gap_warnings(counts.gaps[side], path, session_key, customer_key):
                click.echo(f"warning: {warning}", err=True)
    for name, counts in runs.items():
        if counts.pairing.get("by") == "request" and pair_by == "auto":
            click.echo(f"note: {name + ': ' if len(runs) > 1 else ''}calls paired by request "
                       f"({counts.pairing['reason']}); each distinct request is its own session in the store",
                       err=True)
    problems = {name: pairing_problem(counts, session_key) or mismatch_problem(counts, max_mismatched)
                for name, counts in runs.items()}
    failed = [f"{name}: {p}" if len(runs) > 1 else p for name, p in problems.items() if p]
    if failed:
        raise click.ClickException("; ".join(failed))


def _require_logs(logs: list[str]) -> None:
    """A log that is not there is a usage error (exit 2, as a run that is not there), said before a database is
    opened; a log that is there but cannot be read fails while running (exit 1)."""
    from toolaudit import TraceFileNotFound

    for log in logs:
        if not os.path.exists(log):
            raise TraceFileNotFound(log)


def _recorded_temperature(logs: list[str], session_key: str, customer_key: str, fmt: str | None) -> float | None:
    """The highest temperature the logs' first requests asked for; said before the comparison when > 0 (each
    call then has one sample per side: its differences are sampling noise, not drift)."""
    from toolaudit.ingest.temperature import SCANNED, recorded_temperature

    temps = [t for t in (recorded_temperature(log, session_key, customer_key, fmt) for log in logs) if t]
    if not temps:
        return None
    click.echo(f"warning: the recorded requests sample (temperature up to {max(temps):g} in the first {SCANNED} "
               "of a log): with one answer per call on each side, a call that differs measures sampling noise, not "
               "drift; replay the calls with --samples N (e.g. 16) to test whether the tool-call distribution "
               "moved (docs/statistics.md)", err=True)
    return max(temps)
