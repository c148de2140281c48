"""The `toolaudit` command line: a thin layer over the library that turns typed errors into messages."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

import click

from toolaudit import __version__
from toolaudit.errors import ToolauditError
from toolaudit.output import format_table, output_options, pct, print_rows, to_json

CONTEXT = {"help_option_names": ["-h", "--help"]}


def db_option(func: Callable) -> Callable:
    return click.option("--db", "db", envvar="TOOLAUDIT_DB", default="toolaudit.duckdb", show_default=True,
                        type=click.Path(dir_okay=False),
                        help="DuckDB file (or set TOOLAUDIT_DB).")(func)


def friendly_errors(func: Callable) -> Callable:
    """Library errors become one-line messages with exit code 1, never tracebacks."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except ToolauditError as exc:
            raise click.ClickException(str(exc)) from None

    return wrapper


def _count_lines(paths: list[str]) -> int:
    total = 0
    for path in paths:
        try:
            with open(path, "rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    total += chunk.count(b"\n")
        except OSError:
            pass
    return total


class Progress:
    """A click progress bar on a terminal, nothing otherwise (logs and pipes stay clean)."""

    def __init__(self, label: str, length: int):
        self.bar = None
        if sys.stderr.isatty() and length > 0:
            self.bar = click.progressbar(length=length, label=label, file=sys.stderr, show_eta=True,
                                         show_pos=True)

    def __enter__(self) -> Callable[[int], None] | None:
        if self.bar is None:
            return None
        self.bar.__enter__()
        return self.bar.update

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, "--version", prog_name="toolaudit")
def cli() -> None:
    """Measure how often two decode paths produce different tool calls for the same requests."""


@cli.command()
@click.argument("baseline", type=click.Path(dir_okay=False))
@click.argument("candidate", type=click.Path(dir_okay=False))
@db_option
@click.option("--run-name", help="A name for this run (default run-<id>).")
@click.option("--session-key", default="request.metadata.session_id", show_default=True,
              help="Dotted path of the session id in each line.")
@click.option("--customer-key", default="request.metadata.customer", show_default=True,
              help="Dotted path of the customer in each line.")
@click.option("--schemas", "schema_dir", default="schemas", show_default=True,
              type=click.Path(file_okay=False), help="Folder of <tool>.json schemas that override the request's.")
@click.option("--baseline-name", default="baseline", show_default=True, help="Label of the baseline path.")
@click.option("--candidate-name", default="candidate", show_default=True, help="Label of the candidate path.")
@click.option("--workers", type=click.IntRange(1, 64), help="Processes that parse the logs (default: one per core "
              "for logs over 64 MB, else 1).")
@output_options
@friendly_errors
def compare(baseline: str, candidate: str, db: str, run_name: str | None, session_key: str, customer_key: str,
            schema_dir: str, baseline_name: str, candidate_name: str, workers: int | None, fmt: str) -> None:
    """Compare two recorded logs of the same requests, call by call and argument by argument."""
    from toolaudit.compare import CompareOptions, compare_logs
    from toolaudit.store import Store
    from toolaudit.summary import run_summary

    options = CompareOptions(session_key=session_key, customer_key=customer_key,
                             schema_dir=schema_dir if os.path.isdir(schema_dir) else None, run_name=run_name,
                             baseline_name=baseline_name, candidate_name=candidate_name, workers=workers)
    with Store(db) as store:
        with Progress("comparing", _count_lines([baseline, candidate]) if sys.stderr.isatty() else 0) as tick:
            run_id, _ = compare_logs(store, baseline, candidate, options, progress=tick)
        show_summary(run_summary(store, run_id), fmt)


@cli.command()
@db_option
@output_options
@friendly_errors
def runs(db: str, fmt: str) -> None:
    """List the runs stored in the database."""
    from toolaudit.store import Store

    with Store(db, read_only=True) as store:
        columns, rows = store.query("""
            SELECT r.run_id, r.name, r.kind, r.status, r.created_at, r.baseline_name, r.candidate_name,
                   count(c.run_id) FILTER (c.match_status = 'matched') AS calls,
                   count(c.run_id) FILTER (c.drifted) AS drifted_calls
            FROM runs r LEFT JOIN calls c USING (run_id)
            GROUP BY ALL ORDER BY r.run_id""")
    print_rows(columns, rows, fmt)


@cli.command()
@db_option
@click.option("--run", "run_id", type=int, help="Run id (default: the latest run).")
@output_options
@friendly_errors
def summary(db: str, run_id: int | None, fmt: str) -> None:
    """Summarise a run: drifted calls with a 95% interval, session drift, a row per customer."""
    from toolaudit.store import Store
    from toolaudit.summary import run_summary

    with Store(db, read_only=True) as store:
        show_summary(run_summary(store, run_id), fmt)


@cli.command()
@click.argument("query")
@db_option
@output_options
@friendly_errors
def sql(query: str, db: str, fmt: str) -> None:
    """Run a SQL query on a read-only connection to the database."""
    import duckdb

    from toolaudit.store import Store

    with Store(db, read_only=True) as store:
        try:
            columns, rows = store.query(query)
        except duckdb.Error as exc:
            raise click.ClickException(f"SQL error: {exc}") from None
    print_rows(columns, rows, fmt)


def show_summary(s: dict, fmt: str) -> None:
    if fmt == "json":
        click.echo(to_json(s))
        return
    if fmt == "csv":
        cols = list(s["customers"][0].keys()) if s["customers"] else ["customer"]
        print_rows(cols, [list(c.values()) for c in s["customers"]], "csv")
        return
    un = s["unmatched_calls"]
    lines = [
        f"run {s['run_id']} ({s['run_name']}, {s['status']}): {s['baseline']} vs {s['candidate']}",
        f"  calls compared        {s['calls']}",
        f"  drifted calls         {s['drifted_calls']} ({pct(s['drift_rate'])}, 95% CI "
        f"{pct(s['ci_low'])}-{pct(s['ci_high'])})",
        f"  exact text matches    {s['exact_text_matches']}",
        "  drift kinds           " + ", ".join(f"{k}={v}" for k, v in s["drift_kinds"].items()),
        f"  sessions              {s['sessions']} (mean {s['mean_calls_per_session']:.1f} calls)",
        f"  session drift         observed {pct(s['observed_session_drift'])}, "
        f"compounded {pct(s['compounded_session_drift'])}",
        f"  unmatched calls       baseline only {un['baseline_only']}, candidate only {un['candidate_only']}",
        f"  error rows            {s['error_rows']}",
        "",
    ]
    click.echo("\n".join(lines))
    if s.get("paths"):
        click.echo(format_table(
            ["side", "path", "calls", "tokens/s", "acceptance", "tokens/pass", "errors"],
            [[p["side"], p["path_name"], p["calls"], f"{p['tokens_per_s']:.1f}" if p["tokens_per_s"] else "-",
              pct(p["acceptance_rate"]) if p["acceptance_rate"] is not None else "-",
              f"{p['tokens_per_forward_pass']:.2f}" if p["tokens_per_forward_pass"] else "-", p["errors"]]
             for p in s["paths"]]))
        if s.get("speedup"):
            click.echo(f"  speedup (candidate vs baseline tokens/s): {s['speedup']:.2f}x")
        if s.get("drifted_with_token_evidence"):
            click.echo(f"  drifted calls with token evidence: {s['drifted_with_token_evidence']}, median "
                       f"top-2 margin at first divergence {s['median_drift_margin']:.3f} logits")
        click.echo("")
    cols = ["customer", "calls", "drifted", "drift", "95% CI", "sessions", "observed", "compounded"]
    rows = [[c["customer"], c["calls"], c["drifted_calls"], pct(c["drift_rate"]),
             f"{pct(c['ci_low'])}-{pct(c['ci_high'])}", c["sessions"], pct(c["observed_session_drift"]),
             pct(c["compounded_session_drift"])] for c in s["customers"]]
    click.echo(format_table(cols, rows))
    worst = s.get("worst_example")
    if worst:
        click.echo(f"\nworst example: session {worst['session_id']} call {worst['call_index']} "
                   f"({worst['customer']}, {worst['tool_name']}): {worst['drift_kind']}: {worst['detail']}")
        if worst.get("first_divergence") is not None:
            margin = worst["baseline_margin"]
            click.echo(f"  first divergent token #{worst['first_divergence']}: {worst['baseline_token']!r} -> "
                       f"{worst['candidate_token']!r} (baseline top-2 margin "
                       f"{'n/a' if margin is None else f'{margin:.3f}'})")
        for d in worst["arg_diffs"][:5]:
            click.echo(f"  {d['arg_path']}: {d['baseline_value']} -> {d['candidate_value']} ({d['diff_kind']})")
        if not worst["arg_diffs"]:
            click.echo(f"  baseline:  {(worst['baseline_text'] or '')[:160]!r}")
            click.echo(f"  candidate: {(worst['candidate_text'] or '')[:160]!r}")


# ---- report and check: per-customer reports and the CI gate (logic in report/ and budgets.py) ----

class _Proportion(click.ParamType):
    """`0.015` or `1.5%` (with points=True also `0.5pp`), as a fraction."""

    name = "P"

    def __init__(self, points: bool = False):
        self.points = points
        self.name = "PP" if points else "P"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        from toolaudit.budgets import parse_proportion

        if isinstance(value, float):
            return value
        try:
            return parse_proportion(value, points=self.points)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class _CannotCheck(click.ClickException):
    """The gate could not be evaluated (no database, no such run, nothing measured): exit 2, not 1."""

    exit_code = 2


@cli.command()
@db_option
@click.option("--run", "run_id", type=int, help="Run id (default: the latest run).")
@click.option("--customer", "customers", multiple=True, help="Customer to report on (repeatable).")
@click.option("--all-customers", is_flag=True, help="One report per customer of the run.")
@click.option("--format", "formats", multiple=True, metavar="html|md|json",
              help="Output formats, repeatable or comma-separated (default: all three).")
@click.option("-o", "--output", "out_dir", default="reports", show_default=True,
              type=click.Path(file_okay=False), help="Folder; files go to <folder>/run-<id>/<customer>.<ext>")
@click.option("--near-tie-margin", default=1.0, show_default=True, type=click.FloatRange(0, min_open=True),
              help="Baseline logit margin below which a divergence counts as a near-tie (numerics).")
@click.option("--max-call-drift", type=_Proportion(),
              help="Call drift budget for routing advice (0.015 or 1.5%).")
@click.option("--max-session-drift", type=_Proportion(), help="Session drift budget for routing advice.")
@click.option("--session-calls", type=click.FloatRange(1), help="Calls per session for the session budget "
              "(default: the customer's mean).")
@friendly_errors
def report(db: str, run_id: int | None, customers: tuple[str, ...], all_customers: bool,
           formats: tuple[str, ...], out_dir: str, near_tie_margin: float, max_call_drift: float | None,
           max_session_drift: float | None, session_calls: float | None) -> None:
    """Write per-customer drift reports (HTML, Markdown, JSON) for a run."""
    from toolaudit.report import ReportOptions, parse_formats, write_reports
    from toolaudit.store import Store

    if bool(customers) == all_customers:
        raise click.UsageError("pass --customer C (repeatable) or --all-customers")
    if session_calls is not None and max_session_drift is None:
        raise click.UsageError("--session-calls needs --max-session-drift")
    wanted = parse_formats(formats)
    options = ReportOptions(near_tie_margin=near_tie_margin, max_call_drift=max_call_drift,
                            max_session_drift=max_session_drift, session_calls=session_calls)
    with Store(db, read_only=True) as store:
        written = write_reports(store, run_id, None if all_customers else customers, wanted, out_dir, options)
    for path in written:
        click.echo(str(path))


@cli.command()
@db_option
@click.option("--run", "run_id", type=int, help="Run id (default: the latest run).")
@click.option("--max-call-drift", type=_Proportion(),
              help="Largest allowed share of drifted calls (0.015 or 1.5%).")
@click.option("--max-session-drift", type=_Proportion(),
              help="Largest allowed share of sessions with any drifted call.")
@click.option("--against", type=int, metavar="RUN", help="Earlier run to compare call drift with.")
@click.option("--max-increase", type=_Proportion(points=True),
              help="Largest allowed rise in call drift vs --against (0.005, 0.5pp or 0.5%).")
@click.option("--expect-fingerprint", metavar="FP",
              help="Fail unless the candidate path has this fingerprint (or an 8+ character prefix).")
@click.option("--use-upper-bound", is_flag=True,
              help="Compare the 95% Wilson upper bound (sessions: 1-(1-upper)^mean calls) instead of the "
                   "point estimates.")
def check(db: str, run_id: int | None, max_call_drift: float | None, max_session_drift: float | None,
          against: int | None, max_increase: float | None, expect_fingerprint: str | None,
          use_upper_bound: bool) -> None:
    """Gate a run on drift bounds: exit 0 within all, 1 when one is broken, 2 on usage errors."""
    from toolaudit.errors import ToolauditError
    from toolaudit.budgets import Bounds, GateUsageError, evaluate
    from toolaudit.store import Store

    bounds = Bounds(max_call_drift, max_session_drift, against, max_increase, expect_fingerprint,
                    use_upper_bound)
    try:
        bounds.validate()
        with Store(db, read_only=True) as store:
            result = evaluate(store, run_id, bounds)
    except GateUsageError as exc:
        raise click.UsageError(str(exc)) from None
    except ToolauditError as exc:
        raise _CannotCheck(str(exc)) from None
    if result.ok:
        click.echo(result.ok_line())
        return
    for violation in result.violations:
        click.echo(violation.message)
    sys.exit(1)


import toolaudit.cli_engine  # noqa: E402,F401  (registers replay, demo, fingerprint)


def main() -> None:  # pragma: no cover
    cli(prog_name="toolaudit")


if __name__ == "__main__":  # pragma: no cover
    main()
