"""The remedy frontier: every candidate of a matrix run (or the one candidate of a plain run) side by side,
with its drift, the session drift it implies, its speed against the shared baseline, whether it is
Pareto-optimal, and, given a drift budget, the remedy to use for a slice of traffic.

The recommendation is judged by the one gate rule `check` uses (`rules.py`): by default the 95% Wilson upper
bound (sessions: 1 - (1 - upper)^calls per session), as the routing advice is: a candidate is used only when the
data show it is within budget (`Budget.rule` picks the point estimate or the lower bound). Among those, the
fastest wins; when none is, or none is faster than the baseline, the answer is the baseline itself
("target-only"). Pareto-optimality is judged on point estimates (it describes the measurements, not a
decision). Session figures use the customer's session length: `--session-calls` when given, else the mean
calls per session of the replayed traces before any sampling (`options.trace_session_calls`), else the mean
of the matched calls per session. Figures come from the `frontier` / `customer_frontier` views, so a
customer's frontier uses that customer's calls only.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolaudit import StoreError
from toolaudit.analysis.figures import run_options
from toolaudit.analysis.rules import DEFAULT_RULE, EPS, Judged, Rule, judge_calls, judge_sessions, session_drift_at
from toolaudit.analysis.stats import Rate, wilson
from toolaudit.store import Store
from toolaudit.store import queries as q

BASELINE_CHOICE = "target-only"  # the recommendation when no candidate is within budget and faster


@dataclass(frozen=True)
class Budget:
    max_call_drift: float | None = None
    max_session_drift: float | None = None
    rule: Rule = DEFAULT_RULE

    @property
    def given(self) -> bool:
        return self.max_call_drift is not None or self.max_session_drift is not None

    def as_dict(self) -> dict:
        return {"max_call_drift": self.max_call_drift, "max_session_drift": self.max_session_drift,
                "rule": self.rule.value}


@dataclass(frozen=True)
class Remedy:
    """One candidate path on one slice of traffic."""

    run_id: int
    candidate: str
    rate: Rate  # drifted of matched calls, 95% Wilson interval
    sessions: int
    observed_session_drift: float | None
    session_calls: float  # the session length the session figures are computed for
    session_drift: float  # 1 - (1 - p)^session_calls
    session_drift_high: float  # the same from the interval's upper bound
    baseline_tokens_per_s: float | None
    candidate_tokens_per_s: float | None
    speedup: float | None
    acceptance_rate: float | None
    tokens_per_forward_pass: float | None
    pareto: bool | None  # None when speed was not measured (recorded logs)
    within_budget: bool | None  # None when no budget was given
    judged: tuple[Judged, ...] = ()  # each budget as the rule judged it

    def as_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k not in ("rate", "judged")}
        out.update(calls=self.rate.n, drifted_calls=self.rate.k, drift_rate=self.rate.p, ci_low=self.rate.low,
                   ci_high=self.rate.high, budget_checks=[j.as_dict() for j in self.judged])
        return out


@dataclass(frozen=True)
class Recommendation:
    choice: str  # a candidate's name, or BASELINE_CHOICE
    run_id: int | None
    reason: str


@dataclass(frozen=True)
class Frontier:
    """The remedies for one slice of a matrix (all traffic when `customer` is None)."""

    matrix_id: int
    baseline: str
    customer: str | None
    budget: Budget
    remedies: list[Remedy]
    recommendation: Recommendation | None

    def as_dict(self) -> dict:
        return {"matrix_id": self.matrix_id, "baseline": self.baseline, "customer": self.customer,
                "budget": self.budget.as_dict(), "remedies": [r.as_dict() for r in self.remedies],
                "recommendation": None if self.recommendation is None else self.recommendation.__dict__}


def matrix_of(store: Store, run_id: int | None) -> dict:
    """The matrix run a run id names (a candidate's run id names its matrix; a plain run is its own)."""
    run = store.run_row(run_id)
    if run["matrix_id"] is not None:
        run = store.run_row(run["matrix_id"])
    return run


def frontier(store: Store, run_id: int | None, customer: str | None = None, budget: Budget | None = None,
             session_calls: float | None = None) -> Frontier:
    """The frontier of a matrix run (or plain run) for all traffic or one customer."""
    budget = budget or Budget()
    run = matrix_of(store, run_id)
    rows = q.frontier_rows(store, run["run_id"], customer)
    if not rows:
        where = f" for customer {customer!r}" if customer is not None else ""
        raise StoreError(f"run {run['run_id']} has no matched calls{where} to put on a frontier")
    if session_calls is None:  # a replay that sampled calls knows its traces' real session lengths
        lengths = run_options(run).get("trace_session_calls") or {}
        session_calls = lengths.get("(all)" if customer is None else customer)
    remedies = [_remedy(row, budget, session_calls) for row in rows]
    recommendation = recommend(remedies, budget) if budget.given else None
    return Frontier(run["run_id"], run["baseline_name"], customer, budget, remedies, recommendation)


def customer_frontiers(store: Store, run_id: int | None, budget: Budget | None = None,
                       session_calls: float | None = None) -> list[Frontier]:
    """One frontier per customer of the matrix, each from that customer's calls only."""
    run = matrix_of(store, run_id)
    return [frontier(store, run["run_id"], c, budget, session_calls)
            for c in q.frontier_customers(store, run["run_id"])]


def _remedy(row: dict, budget: Budget, session_calls: float | None) -> Remedy:
    rate = wilson(row["drifted_calls"], row["calls"])
    length = float(session_calls or row["mean_calls_per_session"] or 1.0)
    judged = []
    if budget.max_call_drift is not None:
        judged.append(judge_calls(rate, budget.max_call_drift, budget.rule))
    if budget.max_session_drift is not None:
        judged.append(judge_sessions(rate, length, budget.max_session_drift, budget.rule))
    return Remedy(row["run_id"], row["candidate"], rate, row["sessions"] or 0, row["observed_session_drift"],
                  length, session_drift_at(rate.p, length), session_drift_at(rate.high, length),
                  row["baseline_tokens_per_s"], row["candidate_tokens_per_s"], row["speedup"],
                  row["acceptance_rate"], row["tokens_per_forward_pass"], row["pareto"],
                  all(j.ok for j in judged) if judged else None, tuple(judged))


def recommend(remedies: list[Remedy], budget: Budget) -> Recommendation:
    """The fastest candidate within budget (by the budget's rule), else the baseline; speed unknown: least drift."""
    judged = budget.rule.of
    within = [r for r in remedies if r.within_budget]
    if not within:
        closest = min(remedies, key=lambda r: judged(r.rate))
        return Recommendation(BASELINE_CHOICE, None, f"no candidate is within budget on its {_rule_name(budget)} "
                                                     f"(closest: {closest.candidate}, {_bound_text(closest)})")
    timed = [r for r in within if r.speedup is not None]
    if not timed:
        best = min(within, key=lambda r: (judged(r.rate), r.candidate))
        return Recommendation(best.candidate, best.run_id, f"within budget with the lowest drift "
                                                           f"{budget.rule.label} (speed was not measured: "
                                                           "recorded logs)")
    best = max(timed, key=lambda r: (r.speedup, -judged(r.rate)))
    if best.speedup <= 1 + EPS:
        return Recommendation(BASELINE_CHOICE, None, f"candidates within budget are not faster than the "
                                                     f"baseline (best {best.candidate} at {best.speedup:.2f}x)")
    return Recommendation(best.candidate, best.run_id, f"fastest within budget: {best.speedup:.2f}x, "
                                                       f"{_bound_text(best)}")


def _rule_name(budget: Budget) -> str:
    return "point estimate" if budget.rule is Rule.POINT else f"95% {budget.rule.label}"


def _bound_text(r: Remedy) -> str:
    return "; ".join(f"{j.what} {100 * j.figure:.2f}% vs max {100 * j.threshold:.2f}%" for j in r.judged)


def frontiers_dict(store: Store, run_id: int | None, budget: Budget | None = None,
                   session_calls: float | None = None) -> dict:
    """All traffic and each customer, as `frontier --json` and `report --json` print them."""
    run = matrix_of(store, run_id)
    return {"overall": frontier(store, run["run_id"], None, budget, session_calls).as_dict(),
            "customers": [f.as_dict() for f in customer_frontiers(store, run["run_id"], budget, session_calls)]}
