"""`toolaudit collect`, the OTLP/HTTP receiver, and the `--collected` options of `replay` and `compare`."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import click

from toolaudit.cli.common import example, friendly_errors


@click.command(epilog=example("toolaudit collect --dir collected/ --port 4318"))
@click.option("--dir", "folder", default="collected", show_default=True, type=click.Path(file_okay=False),
              help="Folder of the collected OTLP/JSON files (one per hour: traces-YYYYMMDDTHH.jsonl, UTC).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (loopback by default).")
@click.option("--port", default=4318, show_default=True, type=click.IntRange(0, 65535),
              help="Port to bind (4318 is OTLP/HTTP's); 0 picks a free one (the address is printed on stderr).")
@click.option("--max-body-bytes", default=32 << 20, show_default=True, type=click.IntRange(1),
              help="Largest request body accepted (decompressed); larger ones are answered 413.")
@click.option("--token-env", metavar="VAR", help="Name of the environment variable holding a bearer token: every "
              "request must then send `Authorization: Bearer <token>` (401 otherwise). The token itself is never "
              "taken from the command line, stored or printed.")
@friendly_errors
def collect(folder: str, host: str, port: int, max_body_bytes: int, token_env: str | None) -> None:
    """Receive OTLP/HTTP traces (POST /v1/traces, protobuf or JSON) and keep their model-call spans on disk.

    Point an OTel exporter or collector at http://HOST:PORT (the Langfuse SDK at its
    /api/public/otel path; GenAI log records, where an instrumentation sends the content as logs, at
    /v1/logs). Each request's LLM spans and records are fsynced before it is answered; other spans are
    dropped. Replay a sample later with `toolaudit replay --collected DIR`."""
    from toolaudit.collect.receiver import collect as run_receiver

    run_receiver(folder, host=host, port=port, max_body=max_body_bytes, token=bearer_token(token_env))


def bearer_token(name: str | None) -> str | None:
    """The token in the environment variable `name` (None: no token asked for). Errors name the variable, never
    a value."""
    if name is None:
        return None
    if not name or "=" in name or "\0" in name:
        raise click.BadParameter("must be the NAME of an environment variable (e.g. TOOLAUDIT_COLLECT_TOKEN), not "
                                 "the token", param_hint="--token-env")
    token = os.environ.get(name)
    if token is None:
        raise click.UsageError(f"--token-env {name}: ${name} is not set (export the token in it before starting)")
    if not token.strip():
        raise click.UsageError(f"--token-env {name}: ${name} is empty")
    if any(c.isspace() or not c.isprintable() for c in token.strip()):
        raise click.UsageError(f"--token-env {name}: ${name} holds spaces or control characters, which an "
                               f"Authorization header cannot carry")
    return token.strip()


def collected_options(func: Callable) -> Callable:
    """--collected DIR and the selection options: the command reads a sample of collected traffic."""
    for decorator in reversed((
        click.option("--collected", type=click.Path(file_okay=False, exists=True), metavar="DIR",
                     help="Read the traffic `toolaudit collect` kept in DIR instead of trace files (the selection "
                          "is written beside --db as one OTLP/JSON file, named on stderr)."),
        click.option("--since", metavar="DURATION", help="With --collected: only traces with a span started in "
                     "this window (e.g. 24h, 30m, 7d)."),
        click.option("--sample", type=click.IntRange(1), metavar="N", help="With --collected: N whole sessions, "
                     "drawn deterministically (smallest keyed hash of the session id)."),
        click.option("--per-customer", is_flag=True, help="With --sample: N sessions of each customer."),
        click.option("--seed", default="", help="With --sample: changes which sessions are drawn (default: none)."),
    )):
        func = decorator(func)
    return func


def check_collected(collected: str | None, since: str | None, sample: int | None, per_customer: bool,
                    seed: str) -> None:
    if collected is None and (since or sample or per_customer or seed):
        raise click.UsageError("--since, --sample, --per-customer and --seed select from --collected DIR")
    if per_customer and sample is None:
        raise click.UsageError("--per-customer needs --sample N")


@dataclass(frozen=True)
class Selected:
    """The --collected selection options of one command."""

    collected: str
    db: str
    since: str | None
    sample: int | None
    per_customer: bool
    seed: str
    session_key: str
    customer_key: str
    trace_format: str


def select(s: Selected, label: str, service: str | None = None, sessions: frozenset[str] | None = None,
           draw: bool = True):
    """The selection from `s.collected` written to `DB.selections/<UTC time>-<label>.jsonl`; told on stderr.
    `draw=False`: no sample of `s`'s (a candidate: every session of the window, or exactly `sessions`, the ones
    drawn for the baseline)."""
    from toolaudit.collect.select import Selection, select_collected, selection_path

    selection = Selection(since=s.since, sample=s.sample if draw else None,
                          per_customer=s.per_customer and draw, seed=s.seed if draw else "", service=service,
                          sessions=sessions, session_key=s.session_key, customer_key=s.customer_key,
                          trace_format=None if s.trace_format == "auto" else s.trace_format)
    selected = select_collected(s.collected, selection_path(s.db, label), selection)
    click.echo(selected.line(s.collected), err=True)
    return selected


def collected_logs(baseline: str | None, candidates: tuple[str, ...], baseline_name: str,
                   candidate_names: tuple[str, ...], baseline_service: str | None, candidate_services: tuple[str, ...],
                   s: Selected) -> tuple[str, tuple[str, ...], str, tuple[str, ...]]:
    """`compare --collected`: the baseline and candidate logs selected by service, with their labels (the service
    names unless given). With --sample, every candidate keeps the sessions drawn for the baseline."""
    if baseline is not None or candidates:
        raise click.UsageError("give two logs or --collected DIR, not both")
    if baseline_service is None or not candidate_services:
        raise click.UsageError("--collected needs --baseline-service and --candidate-service (service.name)")
    base = select(s, "baseline", service=baseline_service)
    drawn = frozenset(base.sessions) if s.sample is not None else None
    logs = tuple(str(select(s, f"candidate{k + 1}", service=service, sessions=drawn, draw=False).path)
                 for k, service in enumerate(candidate_services))
    return (str(base.path), logs, baseline_service if baseline_name == "baseline" else baseline_name,
            candidate_names or candidate_services)
