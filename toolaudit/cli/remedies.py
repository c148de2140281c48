"""`toolaudit frontier`: a matrix run's candidates side by side (drift, session drift, speed, Pareto), and per
customer the remedy to use within a drift budget (shown by cli/show.py, rendered by report/terminal_remedies.py)."""

from __future__ import annotations

import click

from toolaudit.cli.common import (
    budget_options,
    db_option,
    example,
    friendly_errors,
    output_options,
    reading,
    resolve_run,
    rule_option,
    run_option,
)
from toolaudit.cli.show import show_matrix


@click.command(name="frontier", epilog=example("toolaudit frontier --run demo-matrix --max-session-drift 5% "
                                               "--db audit.duckdb"))
@db_option
@run_option(what="Matrix run (or any run):")
@budget_options("frontier")
@click.option("--session-calls", type=click.FloatRange(1), help="Calls per session for session drift (default: "
              "each customer's mean).")
@rule_option
@output_options
@friendly_errors
def frontier_cmd(db: str, run_ref: str | None, session_calls: float | None, rule: str | None, fmt: str,
                 **budgets: float | None) -> None:
    """Candidates of a remedy matrix side by side, and per customer the fastest one within the budget.

    The budget is judged by the rule `check` uses (default: the 95% upper bound, so a candidate is recommended
    only when the data show it is within budget; otherwise the answer is target-only, the baseline). A sampled
    matrix (replay --samples N) is judged on its shifted calls (--max-shifted-calls), its noise floor the
    calibration row."""
    from toolaudit.analysis.budgets import Budget, NoFloor
    from toolaudit.analysis.sampled import NotSampled
    from toolaudit.cli.common import gate_rule

    budget = Budget(rule=gate_rule(rule), **budgets)
    with reading(db) as store:
        try:
            show_matrix(store, resolve_run(store, run_ref), fmt, budget, session_calls)
        except NotSampled as err:
            raise click.UsageError(f"--max-shifted-calls: {err}") from None
        except NoFloor as err:
            raise click.UsageError(f"{err.option}: {err}") from None
