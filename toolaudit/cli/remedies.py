"""`toolaudit frontier`: a matrix run's candidates side by side (drift, session drift, speed, Pareto), and per
customer the remedy to use within a drift budget. Also how `summary`, `replay` and `report` show a matrix."""

from __future__ import annotations

import click

from toolaudit.cli.common import (
    Proportion,
    db_option,
    example,
    friendly_errors,
    output_options,
    print_rows,
    reading,
    resolve_run,
    rule_option,
    run_option,
)
from toolaudit.cli.show import show_summary
from toolaudit.report.output import format_table, pct, to_json


def _p(p: float | None) -> str:
    return "-" if p is None else f"{p:.2g}" if p < 0.001 else f"{p:.3f}"


def _pp(x: float | None) -> str:
    return "-" if x is None else f"{x * 100 + 0.0:+.2f}pp"  # + 0.0: no "-0.00"


def sampled_frontier_text(f, title: str) -> list[str]:
    """A sampled matrix's frontier: each candidate's distribution figures, the noise floor as the calibration row,
    and the recommendation (or which budget to give)."""
    rows = []
    for r in [*f.remedies, *([f.floor] if f.floor is not None else [])]:
        s = r.sampled
        name = f"{r.candidate} (noise floor: calibration)" if r.noise_floor else r.candidate
        if s is None:
            rows.append([name] + ["-"] * 9)
            continue
        share = s.shifted
        drop = s.valid_drop
        rows.append([name, f"{share.k}/{share.n}", pct(share.p) if share.n else "-",
                     f"{pct(share.low)}-{pct(share.high)}" if share.n else "-", _p(s.global_p),
                     "-" if s.median_tv is None else f"{s.median_tv:.2f}",
                     "-" if drop is None else f"{_pp(drop[0])} ({_pp(drop[1])} to {_pp(drop[2])})",
                     "-" if r.speedup is None else f"{r.speedup:.2f}x",
                     "-" if r.pareto is None else ("yes" if r.pareto else "no"),
                     "-" if r.within_budget is None else ("yes" if r.within_budget else "no")])
    base = next((r.baseline_tokens_per_s for r in f.remedies if r.baseline_tokens_per_s), None)
    n = next((r.sampled.samples_per_call for r in f.remedies if r.sampled is not None), None)
    head = f"{title}: sampled, {n} samples per call (distribution_shift, BH q=0.05)"
    lines = [head + (f" (baseline {f.baseline}: {base:.1f} tokens/s)" if base else f" (baseline {f.baseline})"),
             format_table(["candidate", "shifted", "share", "95% CI", "global p", "median TV",
                           "schema-valid drop (95% CI)", "speedup", "pareto", "in budget"], rows)]
    if f.recommendation is not None:
        lines.append(f"  recommended: {f.recommendation.choice} ({f.recommendation.reason})")
    if f.budget_hint:
        lines.append(f"  {'note' if f.recommendation else 'no recommendation'}: {f.budget_hint}")
    return lines


def frontier_text(f, title: str) -> list[str]:
    """One frontier as a table, with the recommendation when a budget was given."""
    if f.sampled:
        return sampled_frontier_text(f, title)
    first = f.remedies[0] if f.remedies else f.floor
    length = f"@{first.session_calls:.1f} calls ({first.session_calls_source})" if first else ""
    rows = []
    floor = f.floor is not None
    for r in f.remedies:
        excess = [] if not floor else ["-" if r.excess is None else
                                       f"{_pp(r.excess.estimate)} ({_pp(r.excess.low)} to {_pp(r.excess.high)})"]
        rows.append([r.candidate, r.rate.n, pct(r.rate.p), f"{pct(r.rate.low)}-{pct(r.rate.high)}", *excess,
                     f"{pct(r.session_drift)} (<= {pct(r.session_drift_high)})",
                     "-" if r.candidate_tokens_per_s is None else f"{r.candidate_tokens_per_s:.1f}",
                     "-" if r.speedup is None else f"{r.speedup:.2f}x",
                     "-" if r.acceptance_rate is None else pct(r.acceptance_rate),
                     "-" if r.pareto is None else ("yes" if r.pareto else "no"),
                     "-" if r.within_budget is None else ("yes" if r.within_budget else "no")])
    base = next((r.baseline_tokens_per_s for r in [*f.remedies, *([f.floor] if floor else [])]
                 if r.baseline_tokens_per_s), None)
    lines = [title + (f" (baseline {f.baseline}: {base:.1f} tokens/s)" if base else f" (baseline {f.baseline})"),
             format_table(["candidate", "calls", "drift", "95% CI", *(["beyond the floor (95% CI)"] if floor else []),
                           f"session drift {length}", "tokens/s", "speedup", "acceptance", "pareto", "in budget"],
                          rows)]
    if floor:
        r = f.floor
        lines.append(f"  noise floor {r.candidate} (a measurement, not a remedy): {r.rate.k}/{r.rate.n} drifted "
                     f"({pct(r.rate.p)}, 95% CI {pct(r.rate.low)}-{pct(r.rate.high)}), the baseline with other "
                     "batch neighbours")
    if f.recommendation is not None:
        lines.append(f"  recommended: {f.recommendation.choice} ({f.recommendation.reason})")
    return lines


def _rule_lines(f) -> list[str]:
    """The rule that decided `in budget` and the recommendations, as `check` prints it."""
    from toolaudit.analysis.rules import rule_line

    return ["", rule_line(f.budget.rule)] if f.budget.given else []


def show_frontiers(overall, per_customer: list, fmt: str, head: str) -> None:
    if fmt == "json":
        click.echo(to_json({"overall": overall.as_dict(), "customers": [f.as_dict() for f in per_customer]}))
        return
    if fmt == "csv":
        rows = [{"customer": f.customer or "(all)", **r.as_dict()} for f in [overall, *per_customer]
                for r in f.remedies]  # the candidates only: the floor's figures are in every row's excess
        header = list(rows[0]) if rows else ["customer", "run_id", "candidate"]  # a run whose candidate is a floor
        print_rows(header, [list(r.values()) for r in rows], "csv")
        return
    lines = [head, *frontier_text(overall, "all customers")]
    for f in per_customer:
        lines += ["", *frontier_text(f, f"customer {f.customer}")]
    click.echo("\n".join(lines + _rule_lines(overall)))


def matrix_head(store, run: dict) -> str:
    members = store.matrix_members(run["run_id"])
    if not members:  # a plain run: a matrix of one, itself
        return (f"run {run['run_id']} ({run['name']}, {run['status']}): baseline {run['baseline_name']} vs "
                f"{run['candidate_name']} (a run outside a matrix: a frontier of one candidate)")
    return (f"matrix run {run['run_id']} ({run['name']}, {run['status']}): baseline {run['baseline_name']} vs "
            f"{len(members)} candidates (runs {', '.join(str(m['run_id']) for m in members)}); "
            f"detail of one: toolaudit summary --run RUN")


def show_matrix(store, run_id: int | None, fmt: str, budget=None, session_calls: float | None = None) -> None:
    from toolaudit.analysis.frontier import customer_frontiers, frontier, matrix_of

    run = matrix_of(store, run_id)
    show_frontiers(frontier(store, run["run_id"], None, budget, session_calls),
                   customer_frontiers(store, run["run_id"], budget, session_calls), fmt, matrix_head(store, run))


def show_run(store, run_id: int | None, fmt: str, db: str | None = None, budget=None, all_rows: bool = False) -> None:
    """A run as `summary` shows it: a matrix as its frontier, any other run as its summary (on one screen; every
    row with `all_rows`)."""
    from toolaudit.analysis.figures import run_summary
    from toolaudit.analysis.floor import is_noise_floor

    run = store.run_row(run_id)
    if run["kind"] == "matrix":
        members = [m for m in store.matrix_members(run["run_id"]) if not is_noise_floor(m)]
        if len(members) != 1:  # candidates side by side (the floor among them)
            show_matrix(store, run["run_id"], fmt, budget)
            return
        run_id = members[0]["run_id"]  # one candidate and its noise floor: the candidate's summary, floor beside
    show_summary(run_summary(store, run_id), fmt, db, all_rows)


@click.command(name="frontier", epilog=example("toolaudit frontier --run demo-matrix --max-session-drift 5% "
                                               "--db audit.duckdb"))
@db_option
@run_option(what="Matrix run (or any run):")
@click.option("--max-call-drift", type=Proportion(), help="Call drift budget for the recommendation (1.5%).")
@click.option("--max-session-drift", type=Proportion(), help="Session drift budget for the recommendation.")
@click.option("--session-calls", type=click.FloatRange(1), help="Calls per session for session drift (default: "
              "each customer's mean).")
@click.option("--max-shifted-calls", type=Proportion(), help="A sampled matrix: the budget on the share of calls "
              "whose outcome distribution shifted (distribution_shift, BH q=0.05), e.g. 5%.")
@click.option("--max-excess", type=Proportion(points=True), help="Budget on each candidate's drift beyond the "
              "noise floor, paired by call (1pp): the candidate's own doing (needs a run with --noise-floor).")
@rule_option
@output_options
@friendly_errors
def frontier_cmd(db: str, run_ref: str | None, max_call_drift: float | None, max_session_drift: float | None,
                 session_calls: float | None, max_shifted_calls: float | None, max_excess: float | None,
                 rule: str | None, fmt: str) -> None:
    """Candidates of a remedy matrix side by side, and per customer the fastest one within the budget.

    The budget is judged by the rule `check` uses (default: the 95% upper bound, so a candidate is recommended
    only when the data show it is within budget; otherwise the answer is target-only, the baseline). A sampled
    matrix (replay --samples N) is judged on its shifted calls (--max-shifted-calls), its noise floor the
    calibration row."""
    from toolaudit.analysis.frontier import Budget, NoFloor
    from toolaudit.analysis.sampled import NotSampled
    from toolaudit.cli.common import gate_rule

    budget = Budget(max_call_drift, max_session_drift, gate_rule(rule), max_shifted_calls, max_excess)
    with reading(db) as store:
        try:
            show_matrix(store, resolve_run(store, run_ref), fmt, budget, session_calls)
        except NotSampled as err:
            raise click.UsageError(f"--max-shifted-calls: {err}") from None
        except NoFloor as err:
            raise click.UsageError(f"--max-excess: {err}") from None
