"""The remedy frontier: every candidate of a matrix run (or the one candidate of a plain run) side by side,
with its drift, the session drift it implies, its speed against the shared baseline, whether it is
Pareto-optimal, and, given a drift budget, the remedy to use for a slice of traffic.

The noise floor (the baseline decoded again with other batch neighbours, or other seeds when sampled) is a
measurement, never a remedy: it is not listed, ranked, judged or recommended. It stands beside the candidates as
`Frontier.floor`, and each candidate carries its floor figures (`Remedy.floor_figures`: its drift beside the
floor's on the same calls, paired by call, with a 95% interval), which a budget can bound (`budgets.Budget`, judged
by the same rule as the other budgets).

The recommendation is judged by the one gate rule `check` uses (`rules.py`): by default the 95% Wilson upper
bound (sessions: 1 - (1 - upper)^calls per session), as the routing advice is: a candidate is used only when the
data show it is within budget (`Budget.rule` picks the point estimate or the lower bound). Among those, the
fastest wins; when none is, or none is faster than the baseline, the answer is the baseline itself
("target-only"). Pareto-optimality is judged on point estimates (it describes the measurements, not a
decision). Session figures use the customer's session length: `--session-calls` when given, else the mean
calls per session of the replayed traces before any sampling (`options.trace_session_calls`), else the mean
of the matched calls per session. Figures come from the `frontier` / `customer_frontier` views, so a
customer's frontier uses that customer's calls only.

A sampled matrix (each call decoded N times per path at temperature > 0, `analysis/sampled.py`) is judged on its
distributions, not on sample 0's drift (which measures sampling noise): each candidate carries its shifted calls
(the run-wide BH verdicts on the slice's calls) with their Wilson interval, the slice's global test, median TV and
schema-valid drop; the noise floor (the baseline with other seeds) is the calibration row, never a remedy; the
budget is `max_shifted_calls`, judged by the same rule, and Pareto-optimality is on the shifted share and speed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from toolaudit import StoreError
from toolaudit.analysis.budgets import Budget, NoFloor
from toolaudit.analysis.figures import run_options
from toolaudit.analysis.floor import FloorFigures, floor_figures, is_noise_floor, paired_keys
from toolaudit.analysis.rules import (
    EPS,
    Judged,
    Rule,
    judge_calls,
    judge_sessions,
    judge_shifted,
    session_drift_at,
)
from toolaudit.analysis.runs import is_sampled
from toolaudit.analysis.sampled import NotSampled, SampledSlice, sampled_slices
from toolaudit.analysis.stats import Rate, wilson
from toolaudit.store import Store
from toolaudit.store import queries as q

BASELINE_CHOICE = "target-only"  # the recommendation when no candidate is within budget and faster
__all__ = ["BASELINE_CHOICE", "Budget", "EmptyFrontier", "Frontier", "NoFloor", "Recommendation", "Remedy",
           "customer_frontiers", "frontier", "frontiers_dict", "matrix_of", "recommend"]  # Budget: budgets.py's


@dataclass(frozen=True)
class Remedy:
    """One candidate path on one slice of traffic."""

    run_id: int
    candidate: str
    rate: Rate  # drifted of matched calls, 95% Wilson interval
    sessions: int
    observed_session_drift: float | None
    session_calls: float  # the session length the session figures are computed for (`session_calls_source`)
    session_drift: float  # 1 - (1 - p)^session_calls
    session_drift_high: float  # the same from the interval's upper bound
    baseline_tokens_per_s: float | None
    candidate_tokens_per_s: float | None
    speedup: float | None
    acceptance_rate: float | None
    tokens_per_forward_pass: float | None
    pareto: bool | None  # None when speed was not measured (recorded logs)
    within_budget: bool | None  # None when no budget was given (and for the noise floor of a sampled matrix)
    judged: tuple[Judged, ...] = ()  # each budget as the rule judged it
    noise_floor: bool = False  # the baseline against itself (batch neighbours, or other seeds when sampled)
    sampled: SampledSlice | None = None  # a sampled matrix: the distribution figures on this slice
    calls_per_session_replayed: float | None = None  # matched calls per session in this run
    calls_per_session_recorded: float | None = None  # the traces' own, before a replay sampled calls
    session_calls_source: str = "replayed"  # "given" (--session-calls) | "recorded" | "replayed"
    floor_figures: FloorFigures | None = None  # beside the noise floor on the calls both matched (None: no floor)

    @property
    def gate_rate(self) -> Rate:
        """What a budget judges: the shifted calls of a sampled candidate, else its drifted calls."""
        return self.sampled.shifted if self.sampled is not None else self.rate

    def as_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k not in ("rate", "judged", "sampled", "floor_figures")}
        out.update(calls=self.rate.n, drifted_calls=self.rate.k, drift_rate=self.rate.p, ci_low=self.rate.low,
                   ci_high=self.rate.high, budget_checks=[j.as_dict() for j in self.judged],
                   sampled=None if self.sampled is None else self.sampled.as_dict(), **paired_keys(self.floor_figures))
        return out


@dataclass(frozen=True)
class Recommendation:
    choice: str  # a candidate's name, or BASELINE_CHOICE
    run_id: int | None
    reason: str


@dataclass(frozen=True)
class Frontier:
    """The remedies for one slice of a matrix (all traffic when `customer` is None), and the noise floor beside
    them (`floor`: a measurement, not among `remedies`)."""

    matrix_id: int
    baseline: str
    customer: str | None
    budget: Budget
    remedies: list[Remedy]
    recommendation: Recommendation | None
    sampled: bool = False  # a sampled matrix: judged on shifted calls (`max_shifted_calls`)
    budget_hint: str | None = None  # a sampled matrix: which budget to give (or which budgets it does not use)
    floor: Remedy | None = None  # the noise floor's own figures on this slice, the candidates' reference

    @property
    def calibration(self) -> Remedy | None:
        """A sampled matrix's noise floor, the row that says what no shift looks like at this N."""
        return self.floor if self.floor is not None and self.floor.sampled is not None else None

    def as_dict(self) -> dict:
        calibration = self.calibration
        return {"matrix_id": self.matrix_id, "baseline": self.baseline, "customer": self.customer,
                "budget": self.budget.as_dict(), "sampled": self.sampled,
                "remedies": [r.as_dict() for r in self.remedies],
                "noise_floor": None if self.floor is None else self.floor.as_dict(),
                "calibration": None if calibration is None else {"candidate": calibration.candidate,
                                                                 "run_id": calibration.run_id,
                                                                 **calibration.sampled.as_dict()},
                "recommendation": None if self.recommendation is None else self.recommendation.__dict__,
                "budget_hint": self.budget_hint}


def matrix_of(store: Store, run_id: int | None) -> dict:
    """The matrix run a run id names (a candidate's run id names its matrix; a plain run is its own)."""
    run = store.run_row(run_id)
    if run["matrix_id"] is not None:
        run = store.run_row(run["matrix_id"])
    return run


Slices = dict[int, dict[str | None, SampledSlice]]  # member run id -> customer (None: all) -> figures


def _members(store: Store, run: dict) -> dict[int, dict]:
    return {m["run_id"]: m for m in (store.matrix_members(run["run_id"]) or [run])}


def _sampled_slices(store: Store, members: dict[int, dict], customers: list[str | None]) -> Slices | None:
    """Every member's sampled figures for `customers`, one read of each member's samples; None when the matrix is
    not sampled."""
    if not any(is_sampled(m) for m in members.values()):
        return None
    return {rid: sampled_slices(store, rid, customers) for rid, m in members.items() if is_sampled(m)}


def frontier(store: Store, run_id: int | None, customer: str | None = None, budget: Budget | None = None,
             session_calls: float | None = None, slices: Slices | None = None) -> Frontier:
    """The frontier of a matrix run (or plain run) for all traffic or one customer. `slices`: a sampled matrix's
    figures when the caller has read them already (`customer_frontiers`). Raises NotSampled for a budget on shifted
    calls of a matrix that is not sampled."""
    budget = budget or Budget()
    run = matrix_of(store, run_id)
    rows = q.frontier_rows(store, run["run_id"], customer)
    if not rows:
        where = f" for customer {customer!r}" if customer is not None else ""
        raise EmptyFrontier(f"run {run['run_id']} has no matched calls{where} to put on a frontier")
    lengths = SessionLengths.of(run, customer, session_calls)
    members = _members(store, run)
    floor_run = next((m for m in members.values() if is_noise_floor(m)), None)
    budget.require_floor(run["run_id"], floor_run)
    slices = slices if slices is not None else _sampled_slices(store, members, [customer])

    def beside(rid: int) -> FloorFigures | None:
        if floor_run is None or rid == floor_run["run_id"]:
            return None
        f = floor_figures(store, rid, customer, floor_run)
        return None if f is None or not f.calls else f

    if slices is None:
        if budget.max_shifted_calls is not None:
            raise NotSampled(f"run {run['run_id']} is not a sampled run: --max-shifted-calls judges sampled runs "
                             "(replay with --samples N at temperature > 0); use --max-call-drift here")
        everyone = [_remedy(row, budget, lengths, members.get(row["run_id"]), None, beside(row["run_id"]))
                    for row in rows]
        remedies = _pareto([r for r in everyone if not r.noise_floor])
        floor = next((r for r in everyone if r.noise_floor), None)  # its pareto: NULL in the view (a reference)
        recommendation = recommend(remedies, budget) if budget.given and remedies else None
        return Frontier(run["run_id"], run["baseline_name"], customer, budget, remedies, recommendation,
                        floor=floor)
    everyone = _sampled_pareto([_remedy(row, budget, lengths, members.get(row["run_id"]),
                                        slices.get(row["run_id"], {}).get(customer), beside(row["run_id"]))
                                for row in rows])
    remedies = [r for r in everyone if not r.noise_floor]
    floor = next((r for r in everyone if r.noise_floor), None)
    recommendation, notes = None, []
    if budget.max_call_drift is not None or budget.max_session_drift is not None:
        notes.append("--max-call-drift and --max-session-drift are not used on a sampled matrix: they judge sample "
                     "0's drift, which at temperature > 0 is sampling noise")
    if budget.max_shifted_calls is not None and remedies:
        recommendation = recommend(remedies, budget)
    elif budget.max_shifted_calls is None:
        notes.append(_budget_hint(remedies, floor, budget))
    return Frontier(run["run_id"], run["baseline_name"], customer, budget, remedies, recommendation, True,
                    "; ".join(notes) or None, floor)


def customer_frontiers(store: Store, run_id: int | None, budget: Budget | None = None,
                       session_calls: float | None = None) -> list[Frontier]:
    """One frontier per customer of the matrix, each from that customer's calls only."""
    run = matrix_of(store, run_id)
    customers = q.frontier_customers(store, run["run_id"])
    slices = _sampled_slices(store, _members(store, run), list(customers))
    return [frontier(store, run["run_id"], c, budget, session_calls, slices) for c in customers]


def _budget_hint(remedies: list[Remedy], floor: Remedy | None, budget: Budget) -> str:
    """Which budget a sampled matrix needs, and the smallest one the data can pass: the noise floor's bound (what
    the baseline against itself reaches at this N and call count), else that of a candidate with no shifted call."""
    floor = floor if floor is not None and floor.sampled is not None else None
    tested = max((r.sampled.shifted.n for r in [*remedies, *([floor] if floor else [])] if r.sampled is not None),
                 default=0)
    if floor is not None and floor.sampled.shifted.n:
        bound = budget.rule.of(floor.sampled.shifted)
        least = f"the noise floor ({floor.candidate}) reaches {100 * bound:.2f}% on its {budget.rule.label}"
    else:
        bound = budget.rule.of(wilson(0, tested)) if tested else 1.0
        least = f"a candidate with no shifted call reaches {100 * bound:.2f}% on its {budget.rule.label}"
    return (f"a sampled matrix is judged on the share of calls whose outcome distribution shifted (sample 0's drift "
            f"is sampling noise): give --max-shifted-calls PCT for a recommendation; {least} over {tested} calls, "
            "so a budget under that passes nothing at this N")


def _sampled_pareto(remedies: list[Remedy]) -> list[Remedy]:
    """Pareto-optimality of a sampled matrix's candidates on the shifted share and speed (the floor is none): no
    other candidate, nor the baseline (no shift, 1.0x), at least as good on both and better on one."""
    points = [(r, r.sampled.shifted.p, r.speedup) for r in remedies
              if not r.noise_floor and r.sampled is not None and r.speedup is not None]
    out = []
    for r in remedies:
        if r.noise_floor or r.sampled is None or r.speedup is None:
            out.append(replace(r, pareto=None))
            continue
        share, speed = r.sampled.shifted.p, r.speedup
        beaten = speed <= 1 and (share > 0 or speed < 1)
        beaten = beaten or any(o is not r and s <= share and v >= speed and (s < share or v > speed)
                               for o, s, v in points)
        out.append(replace(r, pareto=not beaten))
    return out


def _pareto(remedies: list[Remedy]) -> list[Remedy]:
    """Pareto-optimality on drift and speed among the candidates (the noise floor is none of them): no other
    candidate, nor the baseline (no drift, 1.0x), at least as good on both and better on one. None where speed
    was not measured (recorded logs)."""
    points = [(r, r.rate.p, r.speedup) for r in remedies if r.speedup is not None]
    out = []
    for r in remedies:
        if r.speedup is None:
            out.append(replace(r, pareto=None))
            continue
        drift, speed = r.rate.p, r.speedup
        beaten = speed <= 1 and (drift > 0 or speed < 1)
        beaten = beaten or any(o is not r and d <= drift and v >= speed and (d < drift or v > speed)
                               for o, d, v in points)
        out.append(replace(r, pareto=not beaten))
    return out


class EmptyFrontier(StoreError):
    """No candidate has a matched call to put on the frontier (every call truncated, failed or mismatched)."""


@dataclass(frozen=True)
class SessionLengths:
    """The session length session figures use, and both lengths a slice has: as replayed (matched calls per
    session here) and as recorded (the traces' own, stored by a replay that sampled calls)."""

    given: float | None
    recorded: float | None

    @staticmethod
    def of(run: dict, customer: str | None, given: float | None) -> SessionLengths:
        traced = run_options(run).get("trace_session_calls") or {}
        return SessionLengths(given, traced.get("(all)" if customer is None else customer))

    def pick(self, replayed: float | None) -> tuple[float, str]:
        if self.given is not None:
            return float(self.given), "given"
        if self.recorded is not None:
            return float(self.recorded), "recorded"
        return float(replayed or 1.0), "replayed"


def _judge(row: dict, rate: Rate, length: float, budget: Budget, sampled: SampledSlice | None,
           floor: FloorFigures | None) -> list[Judged]:
    """A candidate's budgets as the rule judges them (never the floor's: it is the reference)."""
    judged = []
    if sampled is not None:  # sample 0's drift is noise: a sampled candidate is judged on its shifted calls
        if budget.max_shifted_calls is not None:
            judged.append(judge_shifted(sampled.shifted, budget.max_shifted_calls, budget.rule))
    else:
        if budget.max_call_drift is not None:
            judged.append(judge_calls(rate, budget.max_call_drift, budget.rule))
        if budget.max_session_drift is not None:
            judged.append(judge_sessions(rate, length, budget.max_session_drift, budget.rule))
    return judged + budget.judge_floor(floor, f"run {row['run_id']} ({row['candidate']})")


def _remedy(row: dict, budget: Budget, lengths: SessionLengths, member: dict | None = None,
            sampled: SampledSlice | None = None, beside: FloorFigures | None = None) -> Remedy:
    rate = wilson(row["drifted_calls"], row["calls"])
    length, source = lengths.pick(row["mean_calls_per_session"])
    floor = member is not None and is_noise_floor(member)
    judged = [] if floor else _judge(row, rate, length, budget, sampled, beside)
    replayed = None if row["mean_calls_per_session"] is None else float(row["mean_calls_per_session"])
    return Remedy(row["run_id"], row["candidate"], rate, row["sessions"] or 0, row["observed_session_drift"],
                  length, session_drift_at(rate.p, length), session_drift_at(rate.high, length),
                  row["baseline_tokens_per_s"], row["candidate_tokens_per_s"], row["speedup"],
                  row["acceptance_rate"], row["tokens_per_forward_pass"], row["pareto"],
                  None if floor else (all(j.ok for j in judged) if judged else None), tuple(judged), floor, sampled,
                  replayed, lengths.recorded, source, beside)


def recommend(remedies: list[Remedy], budget: Budget) -> Recommendation:
    """The fastest candidate within budget (by the budget's rule), else the baseline; speed unknown: least drift."""
    judged = budget.rule.of
    within = [r for r in remedies if r.within_budget]
    if not within:
        closest = min(remedies, key=lambda r: judged(r.gate_rate))
        return Recommendation(BASELINE_CHOICE, None, f"no candidate is within budget on its {_rule_name(budget)} "
                                                     f"(closest: {closest.candidate}, {_bound_text(closest)})")
    timed = [r for r in within if r.speedup is not None]
    if not timed:
        best = min(within, key=lambda r: (judged(r.gate_rate), r.candidate))
        return Recommendation(best.candidate, best.run_id, f"within budget with the lowest drift "
                                                           f"{budget.rule.label} (speed was not measured: "
                                                           "recorded logs)")
    best = max(timed, key=lambda r: (r.speedup, -judged(r.gate_rate)))
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
