"""Printing what the rendering home (toolaudit/report/terminal*.py) writes: a run's summary, a matrix's
frontiers, as a table, JSON or CSV. The figures come from the analysis package; nothing here computes one."""

from __future__ import annotations

import click

from toolaudit.cli.common import print_rows
from toolaudit.report.output import to_json
from toolaudit.report.terminal import summary_lines
from toolaudit.report.terminal_remedies import frontier_lines, matrix_head


def show_summary(s: dict, fmt: str, db: str | None = None, all_rows: bool = False) -> None:
    """A run's summary: JSON (every figure), CSV (the customer rows), or text that fits one screen (`all_rows`:
    every row of every table)."""
    if fmt == "json":
        click.echo(to_json(s))
        return
    if fmt == "csv":
        cols = list(s["customers"][0].keys()) if s["customers"] else ["customer"]
        print_rows(cols, [list(c.values()) for c in s["customers"]], "csv")
        return
    lines = summary_lines(s, db, all_rows)
    while lines and lines[-1] == "":
        lines.pop()
    click.echo("\n".join(lines))


def show_frontiers(overall, per_customer: list, fmt: str, head: str) -> None:
    if fmt == "json":
        click.echo(to_json({"overall": overall.as_dict(), "customers": [f.as_dict() for f in per_customer]}))
        return
    if fmt == "csv":
        rows = [{"customer": f.customer or "(all)", **r.as_dict()} for f in [overall, *per_customer]
                for r in f.remedies]  # the candidates only: every row carries its floor figures' paired keys
        header = list(rows[0]) if rows else ["customer", "run_id", "candidate"]  # a run whose candidate is a floor
        print_rows(header, [list(r.values()) for r in rows], "csv")
        return
    click.echo("\n".join(frontier_lines(overall, per_customer, head)))


def show_matrix(store, run_id: int | None, fmt: str, budget=None, session_calls: float | None = None) -> None:
    from toolaudit.analysis.frontier import customer_frontiers, frontier, matrix_of

    run = matrix_of(store, run_id)
    show_frontiers(frontier(store, run["run_id"], None, budget, session_calls),
                   customer_frontiers(store, run["run_id"], budget, session_calls), fmt, matrix_head(store, run))


def _show_matrix_of_run(store, run_id: int, fmt: str, budget) -> None:
    """A finished matrix's frontier; one whose calls were all truncated, failed or mismatched is said in words on
    the terminal (the run is stored and complete: `runs` and `summary --run MEMBER` show its counts)."""
    from toolaudit.analysis.frontier import EmptyFrontier

    try:
        show_matrix(store, run_id, fmt, budget)
    except EmptyFrontier as exc:
        if fmt != "table":
            raise
        members = ", ".join(str(m["run_id"]) for m in store.matrix_members(run_id))
        click.echo(f"matrix run {run_id}: no frontier: {exc} (every call truncated, failed or mismatched; raise "
                   f"--max-tokens if answers were cut). Each candidate's counts: toolaudit summary --run ID "
                   f"(runs {members})")


def show_run(store, run_id: int | None, fmt: str, db: str | None = None, budget=None, all_rows: bool = False) -> None:
    """A run as `summary` shows it: a matrix as its frontier, any other run as its summary (on one screen; every
    row with `all_rows`)."""
    from toolaudit.analysis.figures import run_summary
    from toolaudit.analysis.floor import is_noise_floor

    run = store.run_row(run_id)
    if run["kind"] == "matrix":
        members = [m for m in store.matrix_members(run["run_id"]) if not is_noise_floor(m)]
        if len(members) != 1:  # candidates side by side (the floor among them)
            _show_matrix_of_run(store, run["run_id"], fmt, budget)
            return
        run_id = members[0]["run_id"]  # one candidate and its noise floor: the candidate's summary, floor beside
    show_summary(run_summary(store, run_id), fmt, db, all_rows)
