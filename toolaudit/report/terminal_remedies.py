"""A remedy matrix on the terminal (`frontier`, `summary` of a matrix): each candidate's drift, its floor figures
(`report/floor.py`), speed and budget verdict in one table per customer, the floor as the reference row, and the
recommendation; a sampled matrix's distribution figures instead."""

from __future__ import annotations

from toolaudit.report.floor import REMEDY_COLUMN, remedy_cells
from toolaudit.report.numbers import p_value, pct, signed_points, span
from toolaudit.report.output import format_table


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
                     f"{pct(share.low)}-{pct(share.high)}" if share.n else "-", p_value(s.global_p),
                     "-" if s.median_tv is None else f"{s.median_tv:.2f}",
                     "-" if drop is None else f"{signed_points(drop[0])} ({span(drop[1], drop[2])})",
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
        beside = remedy_cells(r.floor_figures) if floor else []
        rows.append([r.candidate, r.rate.n, pct(r.rate.p), f"{pct(r.rate.low)}-{pct(r.rate.high)}", *beside,
                     f"{pct(r.session_drift)} (<= {pct(r.session_drift_high)})",
                     "-" if r.candidate_tokens_per_s is None else f"{r.candidate_tokens_per_s:.1f}",
                     "-" if r.speedup is None else f"{r.speedup:.2f}x",
                     "-" if r.acceptance_rate is None else pct(r.acceptance_rate),
                     "-" if r.pareto is None else ("yes" if r.pareto else "no"),
                     "-" if r.within_budget is None else ("yes" if r.within_budget else "no")])
    base = next((r.baseline_tokens_per_s for r in [*f.remedies, *([f.floor] if floor else [])]
                 if r.baseline_tokens_per_s), None)
    lines = [title + (f" (baseline {f.baseline}: {base:.1f} tokens/s)" if base else f" (baseline {f.baseline})"),
             format_table(["candidate", "calls", "drift", "95% CI", *([REMEDY_COLUMN] if floor else []),
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


def rule_lines(f) -> list[str]:
    """The rule that decided `in budget` and the recommendations, as `check` prints it."""
    from toolaudit.analysis.rules import rule_line

    return ["", rule_line(f.budget.rule)] if f.budget.given else []


def matrix_head(store, run: dict) -> str:
    members = store.matrix_members(run["run_id"])
    if not members:  # a plain run: a matrix of one, itself
        return (f"run {run['run_id']} ({run['name']}, {run['status']}): baseline {run['baseline_name']} vs "
                f"{run['candidate_name']} (a run outside a matrix: a frontier of one candidate)")
    return (f"matrix run {run['run_id']} ({run['name']}, {run['status']}): baseline {run['baseline_name']} vs "
            f"{len(members)} candidates (runs {', '.join(str(m['run_id']) for m in members)}); "
            f"detail of one: toolaudit summary --run RUN")


def frontier_lines(overall, per_customer: list, head: str) -> list[str]:
    """Every frontier (all customers, then each customer) under `head`, then the rule that judged them."""
    lines = [head, *frontier_text(overall, "all customers")]
    for f in per_customer:
        lines += ["", *frontier_text(f, f"customer {f.customer}")]
    return lines + rule_lines(overall)
