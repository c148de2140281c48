"""`toolaudit report` (per-customer drift reports) and `toolaudit check` (the CI gate; logic in budgets.py)."""

from __future__ import annotations

import sys

import click

from toolaudit.cli.common import Proportion, db_option, friendly_errors, reading


class CannotCheck(click.ClickException):
    """The gate could not be evaluated (no database, no such run, nothing measured): exit 2, not 1."""

    exit_code = 2


@click.command()
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
@click.option("--max-call-drift", type=Proportion(),
              help="Call drift budget for routing advice (0.015 or 1.5%).")
@click.option("--max-session-drift", type=Proportion(), help="Session drift budget for routing advice.")
@click.option("--session-calls", type=click.FloatRange(1), help="Calls per session for the session budget "
              "(default: the customer's mean).")
@friendly_errors
def report(db: str, run_id: int | None, customers: tuple[str, ...], all_customers: bool,
           formats: tuple[str, ...], out_dir: str, near_tie_margin: float, max_call_drift: float | None,
           max_session_drift: float | None, session_calls: float | None) -> None:
    """Write per-customer drift reports (HTML, Markdown, JSON) for a run.

    For a matrix run (`replay --candidate A --candidate B ...`): each candidate's reports, and per customer a
    remedy report (every candidate's drift and speed, the Pareto frontier, the fastest candidate within the
    --max-call-drift / --max-session-drift budget), also printed here."""
    from toolaudit.report import ReportOptions, parse_formats, write_reports

    if bool(customers) == all_customers:
        raise click.UsageError("pass --customer C (repeatable) or --all-customers")
    if session_calls is not None and max_session_drift is None:
        raise click.UsageError("--session-calls needs --max-session-drift")
    wanted = parse_formats(formats)
    options = ReportOptions(near_tie_margin=near_tie_margin, max_call_drift=max_call_drift,
                            max_session_drift=max_session_drift, session_calls=session_calls)
    with reading(db) as store:
        written = write_reports(store, run_id, None if all_customers else customers, wanted, out_dir, options)
        if store.run_row(run_id)["kind"] == "matrix":  # the remedies per customer on the terminal too
            from toolaudit.analysis.frontier import Budget
            from toolaudit.cli.remedies import show_matrix

            show_matrix(store, run_id, "table", Budget(max_call_drift, max_session_drift), session_calls)
    for path in written:
        click.echo(str(path))


@click.command()
@db_option
@click.option("--run", "run_id", type=int, help="Run id (default: the latest run).")
@click.option("--max-call-drift", type=Proportion(),
              help="Largest allowed share of drifted calls (0.015 or 1.5%).")
@click.option("--max-session-drift", type=Proportion(),
              help="Largest allowed share of sessions with any drifted call.")
@click.option("--against", type=int, metavar="RUN", help="Earlier run to compare call drift with.")
@click.option("--max-increase", type=Proportion(points=True),
              help="Largest allowed rise in call drift vs --against (0.005, 0.5pp or 0.5%).")
@click.option("--expect-fingerprint", metavar="FP",
              help="Fail unless the candidate path has this fingerprint (or an 8+ character prefix).")
@click.option("--use-upper-bound", is_flag=True,
              help="Compare the 95% Wilson upper bound (sessions: 1-(1-upper)^mean calls) instead of the "
                   "point estimates.")
def check(db: str, run_id: int | None, max_call_drift: float | None, max_session_drift: float | None,
          against: int | None, max_increase: float | None, expect_fingerprint: str | None,
          use_upper_bound: bool) -> None:
    """Gate a run on drift bounds: exit 0 within all, 1 when one is broken, 2 on usage errors.

    A matrix run gates every candidate; each broken bound is printed with the candidate's name."""
    from toolaudit import ToolauditError
    from toolaudit.analysis.budgets import Bounds, GateUsageError, evaluate_candidates

    bounds = Bounds(max_call_drift, max_session_drift, against, max_increase, expect_fingerprint,
                    use_upper_bound)
    try:
        bounds.validate()
        with reading(db) as store:
            gates = evaluate_candidates(store, run_id, bounds)
    except GateUsageError as exc:
        raise click.UsageError(str(exc)) from None
    except ToolauditError as exc:
        raise CannotCheck(str(exc)) from None
    matrix = len(gates) > 1
    for gate in gates:  # a matrix gates each candidate and names it; a plain run prints as before
        label = f"candidate {gate.candidate} (run {gate.run_id}): " if matrix else ""
        if gate.result.ok:
            click.echo((f"candidate {gate.candidate}: " if matrix else "") + gate.result.ok_line())
        for violation in gate.result.violations:
            click.echo(label + violation.message)
    if not all(g.result.ok for g in gates):
        sys.exit(1)
