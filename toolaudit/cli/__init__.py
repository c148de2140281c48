"""The `toolaudit` command line: a thin layer over the library. The root group adds each command family
explicitly (as inspect_ai's `_cli/main.py` does); no command module imports this one."""

from __future__ import annotations

import click

from toolaudit import __version__
from toolaudit.cli.batch import batch
from toolaudit.cli.collect import collect
from toolaudit.cli.common import CONTEXT, example
from toolaudit.cli.compare import compare
from toolaudit.cli.export import export_cmd
from toolaudit.cli.gate import check, report
from toolaudit.cli.history import history_cmd
from toolaudit.cli.imports import import_cmd
from toolaudit.cli.interrupts import ARGV
from toolaudit.cli.merge import merge
from toolaudit.cli.model import model
from toolaudit.cli.query import runs, sql, summary
from toolaudit.cli.remedies import frontier_cmd
from toolaudit.cli.replay import demo, fingerprint_cmd, replay
from toolaudit.cli.serve import serve


class _Group(click.Group):
    """Keeps the command line it parsed: an interrupted compare prints it to run again (`interrupts.py`)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta[ARGV] = list(args)
        return super().parse_args(ctx, args)


@click.group(cls=_Group, context_settings=CONTEXT, epilog=example(
    "toolaudit compare baseline.jsonl candidate.jsonl --run-name nightly --db audit.duckdb",
    "toolaudit check --run nightly --max-call-drift 1.5% --db audit.duckdb"))
@click.version_option(__version__, "--version", prog_name="toolaudit")
def cli() -> None:
    """Measure how often two decode paths produce different tool calls for the same requests."""


for command in (compare, import_cmd, runs, summary, sql, report, check, history_cmd, replay, demo, fingerprint_cmd,
                serve, collect, merge, export_cmd, batch, frontier_cmd, model):
    cli.add_command(command)


def main() -> None:  # pragma: no cover
    cli(prog_name="toolaudit")
