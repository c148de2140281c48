"""`check --against RUN`: has call drift risen since an earlier run, beyond noise and beyond the allowed rise?

The two runs are independent samples, so the question is about the difference of two proportions: its 95%
interval is Newcombe's hybrid score interval (`stats.newcombe`). The check fails only when the rise is
significant (the interval lies above 0) AND the point rise is over `--max-increase`: a rise that noise could
explain is not a regression, and a real but small one is within what was allowed. Comparing the two runs'
own intervals instead is wrong both ways (overlapping 95% intervals can still differ significantly).

The inputs are compared too: a difference between runs on different calls mixes a change of the decode path
with a change of traffic, so the check says how they differ (by the (session, call index) keys of their calls).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toolaudit.analysis.figures import RunFigures
from toolaudit.analysis.rules import EPS
from toolaudit.analysis.stats import Difference, Rate, newcombe
from toolaudit.report.numbers import pct, points, signed_points
from toolaudit.store import Store
from toolaudit.store import queries as q

RULE_TEXT = ("the rise fails when its 95% interval (Newcombe) lies above 0 and the point rise is over "
             "--max-increase")


@dataclass(frozen=True)
class Inputs:
    """How two runs' inputs overlap, by the (session, call index) keys of their calls."""

    run_id: int
    other_id: int
    shared: int
    only_run: int
    only_other: int

    @property
    def same(self) -> bool:
        return self.only_run == 0 and self.only_other == 0

    @property
    def calls(self) -> int:
        return self.shared + self.only_run

    @property
    def other_calls(self) -> int:
        return self.shared + self.only_other

    def warning(self) -> str | None:
        """One line saying how the inputs differ, None when they are the same calls."""
        if self.same:
            return None
        return (f"warning: run {self.run_id} and run {self.other_id} were measured on different inputs: "
                f"{self.calls} vs {self.other_calls} calls, {self.shared} (session, call index) keys shared, "
                f"{self.only_run} only in run {self.run_id}, {self.only_other} only in run {self.other_id}; "
                "the difference mixes the decode paths' change with the traffic's")

    def as_dict(self) -> dict[str, Any]:
        return {"same": self.same, "calls": self.calls, "other_calls": self.other_calls, "shared": self.shared,
                "only_run": self.only_run, "only_other": self.only_other}


def inputs_of(store: Store, run_id: int, other_id: int) -> Inputs:
    overlap = q.input_overlap(store, run_id, other_id)
    return Inputs(run_id, other_id, overlap["shared"], overlap["only_run"], overlap["only_other"])


@dataclass(frozen=True)
class Regression:
    """The call drift of `run_id` against the earlier run `against`."""

    run_id: int
    against: int
    before: Rate
    after: Rate
    difference: Difference  # after - before, with its 95% interval
    max_increase: float
    inputs: Inputs

    @property
    def significant(self) -> bool:
        return self.difference.significant_increase

    @property
    def over(self) -> bool:
        return self.difference.estimate > self.max_increase + EPS

    @property
    def ok(self) -> bool:
        return not (self.significant and self.over)

    def verdict(self) -> str:
        d, limit = self.difference, f"max increase {points(self.max_increase)}"
        if d.estimate <= EPS:
            return "no increase"
        if self.significant:
            return f"significant and {'>' if self.over else '<='} {limit}"
        over = f"; {points(d.estimate)} > {limit}" if self.over else ""
        return f"not significant (the interval includes 0){over}"

    def message(self) -> str:
        d = self.difference
        rise = d.estimate
        change = f"rose {points(rise)}" if rise > EPS else f"fell {points(-rise)}" if rise < -EPS else "unchanged"
        return (f"call drift {change} vs run {self.against} ({pct(self.before.p)} of {self.before.n} -> "
                f"{pct(self.after.p)} of {self.after.n} calls; 95% CI of the difference {signed_points(d.low)} "
                f"to {signed_points(d.high)}): {self.verdict()}")

    def as_dict(self) -> dict[str, Any]:
        def rate(r: Rate) -> dict[str, Any]:
            return {"calls": r.n, "drifted_calls": r.k, "drift_rate": r.p, "interval": [r.low, r.high]}

        return {"against": self.against, "before": rate(self.before), "after": rate(self.after),
                "significant": self.significant, "inputs": self.inputs.as_dict()}


def regression(store: Store, figures: RunFigures, before: RunFigures, max_increase: float) -> Regression:
    """Judge `figures` (the run checked) against `before` (the `--against` run)."""
    return Regression(figures.run_id, before.run_id, before.rate, figures.rate,
                      newcombe(figures.rate, before.rate), max_increase,
                      inputs_of(store, figures.run_id, before.run_id))
