"""The one rule that judges a drift figure against a budget, shared by `check` and `frontier` (the reports'
routing advice judges on the default, the upper bound).

A measured drift rate is a sample: the rule says which end of its 95% Wilson interval must be within budget.

- `upper` (the default): the upper bound. Passes only when the data show the budget is met, so a candidate
  whose true drift sits at the budget fails, and a small sample cannot pass by luck (0 drifted of 20 calls
  has an upper bound of 16%). The burden of proof is on the change: what a gate that ships a decode path and
  a router that sends a customer to it both need. It costs calls: the sample must be large enough for the
  interval to fit under the budget (docs/gates.md has the numbers).
- `point`: the point estimate. Fails when the measured rate is over the budget; a true rate at the budget
  passes about half the time, and small samples pass or fail on noise.
- `lower`: the lower bound. Fails only when the data show the budget is exceeded: a gate that must never
  block on noise (an alert rather than a release gate).

Session budgets are judged on the session drift the per-call figure implies, 1 - (1 - p)^L for sessions of
L calls, with p the same end of the interval (it assumes calls drift independently).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from enum import Enum
from typing import Any

from toolaudit.analysis.stats import Rate

# Float slack when comparing a measured figure with a bound: 1.50% measured against "max 1.5%" passes.
EPS = 1e-12


class Rule(str, Enum):
    UPPER = "upper"
    POINT = "point"
    LOWER = "lower"

    def __str__(self) -> str:
        return self.value

    @property
    def label(self) -> str:
        """What the rule compares, as it reads in a message (`call drift upper bound 2.09% > max 1.50%`)."""
        return {"upper": "upper bound", "point": "point estimate", "lower": "lower bound"}[self.value]

    @property
    def description(self) -> str:
        """The line `check` and `frontier` print under their verdicts."""
        return {
            "upper": "upper bound of the 95% Wilson interval: fails unless the data show the budget is met",
            "point": "point estimate: fails when the measured rate is over the budget",
            "lower": "lower bound of the 95% Wilson interval: fails only when the data show the budget is "
                     "exceeded",
        }[self.value]

    def of(self, rate: Rate) -> float:
        """The end of the interval (or the point) this rule judges."""
        return self.pick(rate.p, rate.low, rate.high)

    def pick(self, estimate: float, low: float, high: float) -> float:
        """The same for any figure with a 95% interval (a paired difference)."""
        return high if self is Rule.UPPER else low if self is Rule.LOWER else estimate


DEFAULT_RULE = Rule.UPPER
RULE_NAMES = tuple(r.value for r in Rule)  # the CLI's --rule choices (`cli.common.RULES`, kept equal by a test)


def rule_line(rule: Rule) -> str:
    other = " or ".join(f"--rule {r.value}" for r in Rule if r is not rule)
    return f"rule: {rule.description} ({other} to change)"


def session_drift_at(p_call: float, calls_per_session: float) -> float:
    """Session drift implied by a per-call rate: 1 - (1 - p)^n (n may be a mean, hence fractional)."""
    return 1.0 - (1.0 - p_call) ** calls_per_session


@dataclass(frozen=True)
class Judged:
    """One budget judged by a rule: the figure with its interval, the value the rule compared, the verdict."""

    name: str  # "call_drift" | "session_drift" | "shifted_calls" | "valid_drop" (sampled runs) | budgets.py's
    rule: Rule
    estimate: float
    low: float
    high: float
    figure: float  # the end of the interval (or the point) the rule compared with the threshold
    threshold: float
    ok: bool
    session_calls: float | None = None  # session budgets: the session length the figures are for
    label: str | None = None  # what the figure is called in messages (default: the name, `call drift`)

    @property
    def what(self) -> str:
        base = (self.label or self.name.replace("_", " ")) + ("" if self.rule is Rule.POINT else f" {self.rule.label}")
        return base if self.session_calls is None else f"{base} ({self.session_calls:.1f} calls/session)"

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "rule": self.rule.value, "figure": self.figure, "estimate": self.estimate,
                "interval": [self.low, self.high], "threshold": self.threshold, "ok": self.ok,
                "session_calls": self.session_calls}


def judge_calls(rate: Rate, threshold: float, rule: Rule = DEFAULT_RULE) -> Judged:
    """A call drift budget: the share of drifted calls."""
    figure = rule.of(rate)
    return Judged("call_drift", rule, rate.p, rate.low, rate.high, figure, threshold, figure <= threshold + EPS)


def judge_shifted(rate: Rate, threshold: float, rule: Rule = DEFAULT_RULE) -> Judged:
    """A sampled run's budget on the share of calls whose outcome distribution shifted (of the calls tested)."""
    figure = rule.of(rate)
    return Judged("shifted_calls", rule, rate.p, rate.low, rate.high, figure, threshold, figure <= threshold + EPS)


def judge_drop(name: str, label: str, estimate: float, low: float, high: float, threshold: float,
               rule: Rule = DEFAULT_RULE) -> Judged:
    """A budget on a drop (baseline minus candidate, e.g. of the schema-valid rate) with its 95% interval: the
    same end of the interval as every budget (the upper bound by default: fails unless the data show the drop
    is within budget)."""
    figure = rule.pick(estimate, low, high)
    return Judged(name, rule, estimate, low, high, figure, threshold, figure <= threshold + EPS, label=label)


def judge_sessions(rate: Rate, calls_per_session: float, threshold: float, rule: Rule = DEFAULT_RULE) -> Judged:
    """A session drift budget: the share of sessions of `calls_per_session` calls with any drifted call."""
    at = [session_drift_at(x, calls_per_session) for x in (rate.p, rate.low, rate.high)]
    figure = session_drift_at(rule.of(rate), calls_per_session)
    return Judged("session_drift", rule, at[0], at[1], at[2], figure, threshold, figure <= threshold + EPS,
                  calls_per_session)


def parse_proportion(text: str, points: bool = False) -> float:
    """`0.015` or `1.5%` -> 0.015; with points=True also `0.5pp` (percentage points) -> 0.005.

    Raises ValueError with a message that shows the accepted forms.
    """
    raw = str(text).strip().lower()
    forms = "0.005, 0.5% or 0.5pp" if points else "0.015 or 1.5%"
    scale = Decimal(1)
    for suffix in (("%", "pp") if points else ("%",)):
        if raw.endswith(suffix):
            raw, scale = raw[: -len(suffix)].strip(), Decimal(100)
            break
    try:
        value = Decimal(raw) / scale
    except InvalidOperation:
        raise ValueError(f"{text!r} is not a proportion; use {forms}") from None
    if not value.is_finite() or value < 0 or value > 1:
        raise ValueError(f"{text!r} is outside 0..1 (0%..100%); use {forms}")
    return float(value)
