"""`toolaudit import`: a trace file in any readable format, written as an OpenAI Chat Completions log."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from toolaudit.cli.common import example, format_option, friendly_errors, key_options

SHOWN_ERRORS = 5


@click.command(name="import", epilog=example("toolaudit import otel-export.json -o calls.jsonl"))
@click.argument("trace_file", type=click.Path(dir_okay=False))
@click.argument("logs_files", nargs=-1, type=click.Path(dir_okay=False))
@format_option
@key_options
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, allow_dash=True),
              help="OpenAI-log JSONL to write ('-': standard output).")
@friendly_errors
def import_cmd(trace_file: str, logs_files: tuple[str, ...], trace_format: str, session_key: str, customer_key: str,
               output: str) -> None:
    """Convert a trace file of any registered format into an OpenAI Chat Completions log.

    An OTLP span export may be followed by OTLP/JSON logs exports (LOGS_FILES): their log records carry the
    calls' content in some instrumentation modes and are joined to their spans (a file may also hold both).

    Formats: OTel GenAI, OpenInference, Langfuse, Responses API, and any plug-in's.

    One {"request", "response"} line per call, with session, customer and call index in request.metadata (and
    source_record, the span or observation id). Bad records are listed on stderr as FILE:LINE: field: message;
    a file with no usable call is an error (exit 1) and writes nothing."""
    from toolaudit.ingest.convert import convert, replaced_atomically
    from toolaudit.ingest.gaps import gap_warnings

    with replaced_atomically(None if output == "-" else Path(output), sys.stdout.buffer) as handle:
        done = convert(trace_file, handle, session_key, customer_key, None if trace_format == "auto" else trace_format,
                       logs_files)
    _report(trace_file, output, done.stats, done.errors, done.source)
    for warning in gap_warnings(done.gaps, trace_file, session_key, customer_key):
        click.echo(f"warning: {warning}", err=True)


def _report(trace_file: str, output: str, stats, errors: list, src) -> None:
    how = f"{src.fmt}, {'detected' if src.detected else 'as asked'}" if src else "?"
    click.echo(f"{trace_file} ({how}): {stats.calls} calls written to {output}; {stats.errors} error records, "
               f"{stats.skipped} skipped", err=True)
    for err in sorted(errors, key=lambda e: e.line)[:SHOWN_ERRORS]:
        click.echo(f"  {err}", err=True)
    if len(errors) > SHOWN_ERRORS:
        click.echo(f"  ... {len(errors) - SHOWN_ERRORS} more", err=True)
    if src is not None and src.skipped:
        reasons = sorted(src.skipped.items(), key=lambda kv: (-kv[1], kv[0]))
        click.echo("  skipped: " + ", ".join(f"{n} {reason}" for reason, n in reasons), err=True)
