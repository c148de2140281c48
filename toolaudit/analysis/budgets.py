"""Drift budgets: the `check` gate for CI and the routing advice in reports.

A bound is broken when the measured figure exceeds it. Point estimates by default; with `use_upper_bound`
the 95% Wilson upper bound of the per-call rate (and, for sessions, 1 - (1 - upper)^calls_per_session), so a
run passes only when the data show it is within budget, not merely when it happened to look so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

import orjson

from toolaudit import ToolauditError
from toolaudit.analysis.figures import RunFigures, run_figures, run_options
from toolaudit.analysis.stats import Rate, pct
from toolaudit.store import Store
from toolaudit.store.queries import other_runs_fingerprints

# Float slack when comparing a measured figure with a bound: 1.50% measured against "max 1.5%" passes.
EPS = 1e-12


class GateUsageError(ToolauditError):
    """The bounds asked for cannot be evaluated as given (no bound, --max-increase without --against...)."""


class NothingToCheck(ToolauditError):
    """The run exists but holds nothing to measure (no matched calls)."""


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


def session_upper(ci_high: float, calls_per_session: float) -> float:
    """Session drift implied by a per-call rate: 1 - (1 - p)^n (n may be a mean, hence fractional)."""
    return 1.0 - (1.0 - ci_high) ** calls_per_session


def points(value: float) -> str:
    return f"{100 * value:.2f}pp"


@dataclass(frozen=True)
class Bounds:
    max_call_drift: float | None = None
    max_session_drift: float | None = None
    against: int | None = None
    max_increase: float | None = None
    expect_fingerprint: str | None = None
    use_upper_bound: bool = False

    def validate(self) -> None:
        if self.max_increase is not None and self.against is None:
            raise GateUsageError("--max-increase needs --against RUN (the run to compare with)")
        if self.against is not None and self.max_increase is None:
            raise GateUsageError("--against needs --max-increase PP (the largest allowed rise in call drift)")
        if (self.max_call_drift is None and self.max_session_drift is None and self.against is None
                and self.expect_fingerprint is None):
            raise GateUsageError("no bound given; pass --max-call-drift, --max-session-drift, "
                                 "--against with --max-increase, or --expect-fingerprint")


@dataclass(frozen=True)
class Check:
    """One bound: `message` reads as a violation (`call drift 2.10% > max 1.50%`) or as a pass."""

    name: str
    ok: bool
    message: str


@dataclass
class GateResult:
    figures: RunFigures
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def violations(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def ok_line(self) -> str:
        f = self.figures
        state = "" if f.status == "complete" else f", status {f.status}"
        head = (f"ok: run {f.run_id}{state}: {f.rate.k}/{f.rate.n} calls drifted ({pct(f.rate.p)}, 95% CI "
                f"{pct(f.rate.low)}-{pct(f.rate.high)}), {f.sessions_with_drift}/{f.sessions} sessions")
        return "; ".join([head, *(c.message for c in self.checks)])


def evaluate(store: Store, run_id: int | None, bounds: Bounds) -> GateResult:
    """Measure the run against every bound given. Raises GateUsageError / NothingToCheck / StoreError."""
    bounds.validate()
    figures = run_figures(store, run_id)
    if figures.rate.n == 0:
        raise NothingToCheck(f"run {figures.run_id} has no matched calls; nothing to check")
    result = GateResult(figures)
    upper = bounds.use_upper_bound
    if bounds.max_call_drift is not None:
        measured = figures.rate.high if upper else figures.rate.p
        what = "call drift 95% upper bound" if upper else "call drift"
        result.checks.append(_bound(what, measured, bounds.max_call_drift))
    if bounds.max_session_drift is not None:
        if upper:
            measured = session_upper(figures.rate.high, figures.mean_calls_per_session)
            what = f"session drift 95% upper bound ({figures.mean_calls_per_session:.1f} calls/session)"
        else:
            measured, what = figures.observed_session_drift, "session drift"
        result.checks.append(_bound(what, measured, bounds.max_session_drift))
    if bounds.against is not None:
        result.checks.append(_increase(store, figures, bounds.against, bounds.max_increase or 0.0))
    if bounds.expect_fingerprint is not None:
        result.checks.append(_fingerprint(store, figures, bounds.expect_fingerprint.strip()))
    return result


@dataclass
class CandidateGate:
    """One candidate of a matrix run, gated on its own run."""

    candidate: str
    run_id: int
    result: GateResult


def evaluate_candidates(store: Store, run_id: int | None, bounds: Bounds) -> list[CandidateGate]:
    """Every candidate of a matrix run gated on the same bounds (a plain run: its one candidate)."""
    run = store.run_row(run_id)
    members = store.matrix_members(run["run_id"]) if run["kind"] == "matrix" else [run]
    return [CandidateGate(m["candidate_name"], m["run_id"], evaluate(store, m["run_id"], bounds)) for m in members]


def _bound(what: str, measured: float, bound: float) -> Check:
    ok = measured <= bound + EPS
    return Check(what, ok, f"{what} {pct(measured)} {'<=' if ok else '>'} max {pct(bound)}")


def _increase(store: Store, figures: RunFigures, against: int, max_increase: float) -> Check:
    """Point estimates on both sides: the interval of a difference is not the difference of intervals."""
    before = run_figures(store, against)
    if before.rate.n == 0:
        raise NothingToCheck(f"run {against} (--against) has no matched calls to compare with")
    rise = figures.rate.p - before.rate.p
    ok = rise <= max_increase + EPS
    change = f"rose {points(rise)}" if rise > 0 else f"fell {points(-rise)}" if rise < 0 else "unchanged"
    return Check("call drift increase", ok,
                 f"call drift {change} vs run {against} ({pct(before.rate.p)} -> {pct(figures.rate.p)}) "
                 f"{'<=' if ok else '>'} max increase {points(max_increase)}")


def fingerprint_matches(stored: str | None, expected: str) -> bool:
    """Exact, or an unambiguous-looking prefix of at least 8 characters (like a short git hash)."""
    if not stored or not expected:
        return False
    return stored == expected or (len(expected) >= 8 and stored.startswith(expected))


def flatten(components: dict, prefix: str = "") -> dict[str, Any]:
    """{'speculative': {'method': 'ngram'}} -> {'speculative.method': 'ngram'}."""
    flat: dict[str, Any] = {}
    for key, value in components.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def changed_components(before: dict, after: dict) -> list[tuple[str, Any, Any]]:
    """(component, before, after) for every component that differs, in name order."""
    old, new = flatten(before), flatten(after)
    return [(k, old.get(k), new.get(k)) for k in sorted(old.keys() | new.keys()) if old.get(k) != new.get(k)]


def _value(value: Any) -> str:
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    return text if len(text) <= 60 else text[:57] + "..."


def _fingerprint(store: Store, figures: RunFigures, expected: str) -> Check:
    got = figures.candidate_fingerprint
    if fingerprint_matches(got, expected):
        return Check("fingerprint", True, f"candidate fingerprint {got} matches")
    if not got:
        return Check("fingerprint", False,
                     f"candidate fingerprint not recorded for run {figures.run_id} (expected {expected})")
    message = f"candidate fingerprint {got} != expected {expected}"
    now = figures.options.get("candidate_fingerprint_components")
    known = _components_of(store, expected, figures.run_id) if isinstance(now, dict) else None
    if known is not None:
        run_id, before = known
        changes = changed_components(before, now)
        if changes:
            message += f"; changed since run {run_id}: " + ", ".join(
                f"{name} ({_value(old)} -> {_value(new)})" for name, old, new in changes)
    return Check("fingerprint", False, message)


def _components_of(store: Store, fingerprint: str, exclude_run: int) -> tuple[int, dict] | None:
    """The stored components of the latest other run whose baseline or candidate has this fingerprint."""
    for run in other_runs_fingerprints(store, exclude_run):
        options = run_options(run)
        for side in ("candidate", "baseline"):
            components = options.get(f"{side}_fingerprint_components")
            if fingerprint_matches(run[f"{side}_fingerprint"], fingerprint) and isinstance(components, dict):
                return run["run_id"], components
    return None


# -- routing advice (reports) --------------------------------------------------------------------------------

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
    """Judge one slice on the Wilson upper bound: target-only unless the data show it is within budget."""
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

