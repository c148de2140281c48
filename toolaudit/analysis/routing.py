"""Routing advice in reports: whether one slice of a customer's traffic (all its calls, or one tool's) may use the
candidate path, judged on the Wilson upper bound (the default rule, `rules.py`)."""

from __future__ import annotations

from dataclasses import dataclass

from toolaudit.analysis.rules import EPS
from toolaudit.analysis.rules import session_drift_at as session_upper
from toolaudit.analysis.stats import Rate


@dataclass(frozen=True)
class Advice:
    """Whether one slice of traffic (a customer, or one of its tools) may use the candidate path."""

    scope: str
    calls: int
    drift_rate: float
    ci_high: float
    session_upper: float | None
    within_call_budget: bool | None
    within_session_budget: bool | None
    verdict: str  # "candidate ok" | "target-only"
    reason: str


def routing_advice(scope: str, rate: Rate, max_call_drift: float | None, max_session_drift: float | None,
                   session_calls: float) -> Advice:
    """Judge one slice on the Wilson upper bound (the default rule, `rules.py`): target-only unless the data
    show it is within budget."""
    sess = session_upper(rate.high, session_calls) if max_session_drift is not None else None
    call_ok = None if max_call_drift is None else rate.high <= max_call_drift + EPS
    sess_ok = None if sess is None or max_session_drift is None else sess <= max_session_drift + EPS
    if rate.n == 0:
        return Advice(scope, 0, 0.0, 1.0, sess, None, None, "target-only", "no calls measured")
    if call_ok is not False and sess_ok is not False:
        return Advice(scope, rate.n, rate.p, rate.high, sess, call_ok, sess_ok, "candidate ok",
                      "95% upper bound within budget")
    point_over = ((max_call_drift is not None and rate.p > max_call_drift + EPS)
                  or (max_session_drift is not None
                      and session_upper(rate.p, session_calls) > max_session_drift + EPS))
    reason = "drift over budget" if point_over else "not enough calls to show it is within budget"
    return Advice(scope, rate.n, rate.p, rate.high, sess, call_ok, sess_ok, "target-only", reason)

