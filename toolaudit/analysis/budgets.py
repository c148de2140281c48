"""Drift budgets, declared once: what `check` (the CI gate) and `frontier` (the remedies) judge a candidate by.

`Budget` is the budgets a candidate is judged by, in `check` and `frontier` alike (`Bounds` adds what only the gate
asks); `BUDGET_OPTIONS` declares the budget options the CLI turns into click options; the budget on the floor
figures (`max_excess`) is judged here (`judge_excess`), for both. Every drift budget is judged by one rule
(`rules.py`): by default the 95% Wilson upper bound (sessions: 1 - (1 - upper)^calls per session), so a run passes
only when the data show it is within budget, not merely when it happened to look so; `point` and `lower` on
request. `--against` judges a rise with an interval on the difference (`regression.py`). Error rows (records the
readers could not use, calls an engine failed) fail the gate unless allowed: the drift figures leave them out.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from toolaudit import StoreError, ToolauditError
from toolaudit.analysis.figures import RunFigures, run_figures, run_options
from toolaudit.analysis.floor import FloorFigures, floor_figures, is_noise_floor
from toolaudit.analysis.gate_checks import (  # changed_components: re-exported (engines/fingerprint.py)
    Check,
    changed_components,
    error_rows,
    fingerprint_check,
)
from toolaudit.analysis.regression import RULE_TEXT as INCREASE_RULE
from toolaudit.analysis.regression import regression
from toolaudit.analysis.rules import (
    DEFAULT_RULE,
    EPS,
    Judged,
    Rule,
    judge_calls,
    judge_drop,
    judge_sessions,
    judge_shifted,
    parse_proportion,
    rule_line,
)
from toolaudit.analysis.rules import session_drift_at as session_upper  # the older name (tests, reports)
from toolaudit.analysis.stats import Difference
from toolaudit.report.numbers import pct, points, signed_points
from toolaudit.store import Store

__all__ = ["BUDGET_OPTIONS", "EPS", "INCREASE_RULE", "Bounds", "Budget", "BudgetOption", "CandidateGate", "Check",
           "GateResult", "GateUsageError", "NoFloor", "NothingToCheck", "Verdict", "changed_components", "evaluate",
           "evaluate_candidates", "gate", "judge_excess", "parse_proportion", "points", "session_upper"]


@dataclass(frozen=True)
class BudgetOption:
    """A budget option declared once for the commands that take it: the `Budget` field it sets (the flag is the
    field's name, `--max-...`), whether it bounds a difference (percentage points too), its help per command."""

    field: str
    points: bool
    help: dict[str, str]  # command ("check", "frontier") -> its help there

    @property
    def flag(self) -> str:
        return "--" + self.field.replace("_", "-")


# The budget options the CLI generates (`cli.common.budget_options`); their values come back as `Budget` keywords.
BUDGET_OPTIONS = (
    BudgetOption("max_call_drift", points=False, help={
        "check": "Largest allowed share of drifted calls (0.015 or 1.5%).",
        "frontier": "Call drift budget for the recommendation (1.5%)."}),
    BudgetOption("max_session_drift", points=False, help={
        "check": "Largest allowed share of sessions with any drifted call (judged as 1-(1-p)^calls per session).",
        "frontier": "Session drift budget for the recommendation."}),
    BudgetOption("max_shifted_calls", points=False, help={
        "check": "Sampled runs: largest allowed share of tested calls whose outcome distribution shifted "
                 "(distribution_shift, BH q=0.05; 0.05 or 5%).",
        "frontier": "A sampled matrix: the budget on the share of calls whose outcome distribution shifted "
                    "(distribution_shift, BH q=0.05), e.g. 5%."}),
    BudgetOption("max_excess", points=True, help={
        "check": "Largest allowed drift beyond the run's noise floor, paired by call (0.01, 1pp or 1%): the "
                 "candidate's own doing, batching noise set apart (needs a run with --noise-floor).",
        "frontier": "Budget on each candidate's drift beyond the noise floor, paired by call (1pp): the candidate's "
                    "own doing (needs a run with --noise-floor)."}),
)


@dataclass(frozen=True)
class Budget:
    """The budgets a candidate is judged by, in `frontier` (each remedy) and `check` (`Bounds`), by one rule."""

    max_call_drift: float | None = None
    max_session_drift: float | None = None
    rule: Rule = DEFAULT_RULE
    max_shifted_calls: float | None = None  # a sampled run: the share of calls tested whose distribution shifted
    max_excess: float | None = None  # drift beyond the run's noise floor, paired by call: the candidate's own doing

    @property
    def given(self) -> bool:
        return any(x is not None for x in (self.max_call_drift, self.max_session_drift, self.max_shifted_calls,
                                           self.max_excess))

    def as_dict(self) -> dict:
        return {"max_call_drift": self.max_call_drift, "max_session_drift": self.max_session_drift,
                "max_shifted_calls": self.max_shifted_calls, "max_excess": self.max_excess,
                "rule": self.rule.value}

    def require_floor(self, run_id: int, floor_run: dict | None) -> None:
        """A budget on the floor figures needs a noise floor in the matrix: NoFloor before anything is judged."""
        if self.max_excess is not None and floor_run is None:
            raise NoFloor(f"run {run_id} has no noise floor to measure an excess against: --max-excess needs a "
                          "replay with --noise-floor (on in `toolaudit demo`)")

    def judge_floor(self, floor: FloorFigures | None, who: str) -> list[Judged]:
        """The budget on `who`'s floor figures (None: no call shared with the floor), judged by the rule."""
        if self.max_excess is None:
            return []
        if floor is None:
            raise NoFloor(f"{who} shares no matched call with its noise floor: no excess to judge")
        return [judge_excess(floor.excess, self.max_excess, self.rule)]


class NoFloor(StoreError):
    """A budget on the excess over the noise floor, for a run that has no floor."""

    option = next(o.flag for o in BUDGET_OPTIONS if o.field == "max_excess")  # named in the CLI's usage error


def judge_excess(excess: Difference, threshold: float, rule: Rule = DEFAULT_RULE) -> Judged:
    """A budget on the candidate's own doing: its drift beyond the noise floor, paired by call (candidate-only
    minus floor-only drifted calls over the calls both matched), the same end of its 95% interval as every
    budget. Drift the floor shows too is batching noise, not the candidate's."""
    figure = rule.pick(excess.estimate, excess.low, excess.high)
    return Judged("excess", rule, excess.estimate, excess.low, excess.high, figure, threshold,
                  figure <= threshold + EPS, label="excess over the noise floor")


class GateUsageError(ToolauditError):
    """The bounds asked for cannot be evaluated as given (no bound, --max-increase without --against...)."""


class NothingToCheck(ToolauditError):
    """The run exists but holds nothing to measure (no matched calls)."""


@dataclass(frozen=True)
class Bounds(Budget):
    """The gate's bounds: a candidate's `Budget`, and what only `check` asks (--against, fingerprints, errors)."""

    against: int | None = None
    max_increase: float | None = None
    expect_fingerprint: str | None = None
    allow_errors: int = 0  # error rows tolerated before the gate fails
    session_calls: float | None = None  # session length for session budgets (default: see `session_length`)
    max_valid_drop: float | None = None  # sampled runs: baseline minus candidate schema-valid rate, paired by call

    @property
    def sampled(self) -> bool:
        """Bounds that only a sampled run can be judged by."""
        return self.max_shifted_calls is not None or self.max_valid_drop is not None

    @property
    def given(self) -> bool:
        """Any bound at all (an empty --expect-fingerprint is none, as `check --expect-numerics` reads it)."""
        return (super().given or self.against is not None or bool(self.expect_fingerprint)
                or self.max_valid_drop is not None)

    def validate(self) -> None:
        if self.max_increase is not None and self.against is None:
            raise GateUsageError("--max-increase needs --against RUN (the run to compare with)")
        if self.against is not None and self.max_increase is None:
            raise GateUsageError("--against needs --max-increase PP (the largest allowed rise in call drift)")
        if not self.given and self.expect_fingerprint is None:
            raise GateUsageError("no bound given; pass --max-call-drift, --max-session-drift, --max-excess, "
                                 "--against with --max-increase, --expect-fingerprint, or on a sampled run "
                                 "--max-shifted-calls or --max-valid-drop")
        if self.session_calls is not None and self.max_session_drift is None:
            raise GateUsageError("--session-calls needs --max-session-drift")
        if self.allow_errors < 0:
            raise GateUsageError("--allow-errors must be 0 or more")


@dataclass
class GateResult:
    figures: RunFigures
    rule: Rule = DEFAULT_RULE
    checks: list[Check] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

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
        if int(f.options.get("samples") or 1) > 1:  # sample 0 against sample 0: noise, not drift, when sampling
            head = (f"ok: run {f.run_id}{state}: sampled, {f.options['samples']} samples per call (sample 0 differs "
                    f"in {f.rate.k}/{f.rate.n} calls: sampling noise at temperature > 0)")
        return "; ".join([head, *(c.message for c in self.checks)])

    def as_dict(self) -> dict[str, Any]:
        f = self.figures
        return {"run_id": f.run_id, "name": f.name, "status": f.status, "verdict": "pass" if self.ok else "fail",
                "calls": f.rate.n, "drifted_calls": f.rate.k, "drift_rate": f.rate.p,
                "interval": [f.rate.low, f.rate.high], "sessions": f.sessions,
                "sessions_with_drift": f.sessions_with_drift, "checks": [c.as_dict() for c in self.checks],
                "reasons": [c.message for c in self.violations]}


def session_length(figures: RunFigures, lengths: dict[str, Any] | None = None,
                   session_calls: float | None = None) -> float:
    """The session length session budgets are judged at, as `frontier` picks it (`frontier.SessionLengths`):
    `--session-calls`, else the traces' own mean calls per session (a replay that sampled calls stores them, on
    the matrix run), else the run's mean matched calls per session."""
    traced = (lengths or {}).get("(all)")
    return float(session_calls or traced or figures.mean_calls_per_session or 1.0)


def _traced_lengths(store: Store, figures: RunFigures) -> dict[str, Any] | None:
    """The traces' session lengths for a run: its own options, else its matrix's (a matrix stores them once), so
    `check --run MEMBER` judges sessions at the length `check` of the matrix and `frontier` use."""
    lengths = figures.options.get("trace_session_calls")
    if lengths is None:
        matrix = store.run_row(figures.run_id).get("matrix_id")
        if matrix is not None:
            lengths = run_options(store.run_row(matrix)).get("trace_session_calls")
    return lengths


def evaluate(store: Store, run_id: int | None, bounds: Bounds, lengths: dict[str, Any] | None = None) -> GateResult:
    """Measure the run against every bound given. Raises GateUsageError / NothingToCheck / StoreError.

    `lengths`: the traces' session lengths stored with the run (or its matrix), `{"(all)": mean, ...}`."""
    bounds.validate()
    figures = run_figures(store, run_id)
    greedy = not bounds.sampled or bounds.max_call_drift is not None or bounds.max_session_drift is not None
    if figures.rate.n == 0 and (greedy or bounds.against is not None):  # a sampled run's sample 0 may be cut
        raise NothingToCheck(f"run {figures.run_id} has no matched calls; nothing to check")
    if lengths is None:
        lengths = _traced_lengths(store, figures)
    result = GateResult(figures, bounds.rule)
    if is_noise_floor(store.run_row(figures.run_id)):  # asked for by id: gated, and said what it is
        result.warnings.append(f"run {figures.run_id} decodes the baseline path again (a noise floor): what differs "
                               "is batching noise, not a candidate's doing; a matrix's check skips it")
    if bounds.max_call_drift is not None:
        result.checks.append(_judged(judge_calls(figures.rate, bounds.max_call_drift, bounds.rule)))
    if bounds.max_session_drift is not None:
        length = session_length(figures, lengths, bounds.session_calls)
        result.checks.append(_judged(judge_sessions(figures.rate, length, bounds.max_session_drift, bounds.rule)))
    if bounds.max_excess is not None:
        result.checks.append(_excess(store, figures.run_id, bounds))
    if bounds.sampled:
        result.checks += _sampled_checks(store, figures.run_id, bounds)
    drift_budget = bounds.max_call_drift is not None or bounds.max_session_drift is not None
    if drift_budget and int(figures.options.get("samples") or 1) > 1:
        result.warnings.append(f"run {figures.run_id} is sampled: its call drift compares sample 0 with sample 0, "
                               "sampling noise at temperature > 0; gate on --max-shifted-calls / --max-valid-drop")
    if bounds.against is not None:
        before = run_figures(store, bounds.against)
        if before.rate.n == 0:
            raise NothingToCheck(f"run {bounds.against} (--against) has no matched calls to compare with")
        change = regression(store, figures, before, bounds.max_increase or 0.0)
        result.checks.append(Check("increase", change.ok, change.message(), regression=change))
        if (warning := change.inputs.warning()) is not None:
            result.warnings.append(warning)
    if bounds.expect_fingerprint is not None:
        result.checks.append(fingerprint_check(store, figures, bounds.expect_fingerprint.strip()))
    result.checks.append(error_rows(store, figures.run_id, bounds.allow_errors))
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
    if run["kind"] == "matrix":  # the noise floor is the candidates' reference, never gated as one of them
        members = [m for m in members if not is_noise_floor(m)]
    lengths = run_options(run).get("trace_session_calls")  # a matrix stores them once, on the matrix run
    return [CandidateGate(m["candidate_name"], m["run_id"], evaluate(store, m["run_id"], bounds, lengths))
            for m in members]


@dataclass
class Verdict:
    """The gate's answer over every candidate of a run: what `check` prints (as text or JSON) and exits with."""

    run_id: int
    rule: Rule
    gates: list[CandidateGate]

    @property
    def ok(self) -> bool:
        return all(g.result.ok for g in self.gates)

    @property
    def matrix(self) -> bool:
        return len(self.gates) > 1

    def label(self, gate: CandidateGate, ok: bool = False) -> str:
        """How a matrix names the candidate in front of a line (a plain run: nothing)."""
        if not self.matrix:
            return ""
        return f"candidate {gate.candidate}: " if ok else f"candidate {gate.candidate} (run {gate.run_id}): "

    def reasons(self) -> list[str]:
        return [self.label(g) + c.message for g in self.gates for c in g.result.violations]

    def warnings(self) -> list[str]:
        return list(dict.fromkeys(w for g in self.gates for w in g.result.warnings))

    def rule_lines(self) -> list[str]:
        """Which rules decided: the budgets' rule, and the --against test when one was asked for."""
        names = {c.name for g in self.gates for c in g.result.checks}
        wilson = {"call_drift", "session_drift", "shifted_calls"}  # one rule line per kind of interval judged
        lines = [rule_line(self.rule)] if names & wilson else []
        if "excess" in names:
            lines.append(f"rule (--max-excess): the {self.rule.label} of the 95% paired interval (Agresti-Min) of "
                         "the candidate's drift minus its noise floor's on the same calls, not a Wilson interval")
        if "valid_drop" in names:
            lines.append(f"rule (--max-valid-drop): the {self.rule.label} of the 95% t interval of the per-call "
                         "differences (baseline - candidate schema-valid share), not a Wilson interval")
        return lines + ([f"rule (--against): {INCREASE_RULE}"] if "increase" in names else [])

    def as_dict(self) -> dict[str, Any]:
        return {"verdict": "pass" if self.ok else "fail", "exit_code": 0 if self.ok else 1, "run_id": self.run_id,
                "rule": self.rule.value, "rule_text": self.rule.description,
                "runs": [{"candidate": g.candidate, **g.result.as_dict()} for g in self.gates],
                "reasons": self.reasons(), "warnings": self.warnings()}


def gate(store: Store, run_id: int | None, bounds: Bounds) -> Verdict:
    """`check`: every candidate of the run gated on `bounds`."""
    bounds.validate()
    run = store.run_row(run_id)
    return Verdict(run["run_id"], bounds.rule, evaluate_candidates(store, run["run_id"], bounds))


def _judged(j: Judged) -> Check:
    """`call drift upper bound 2.09% > max 1.50% (point 1.20%, 95% CI 0.69%-2.09%)`: the figure the rule
    compared, and the interval it came from."""
    point = "" if j.rule is Rule.POINT else f"point {pct(j.estimate)}, "
    return Check(j.name, j.ok, f"{j.what} {pct(j.figure)} {'<=' if j.ok else '>'} max {pct(j.threshold)} "
                               f"({point}95% CI {pct(j.low)}-{pct(j.high)})", judged=j)


def _excess(store: Store, run_id: int, bounds: Bounds) -> Check:
    """--max-excess: the run's drift beyond its noise floor, paired by call, judged by the rule like every budget;
    a usage error for a run replayed without a floor."""
    f = floor_figures(store, run_id)
    if f is None:
        raise GateUsageError(f"--max-excess: run {run_id} has no noise floor to measure an excess against (replay "
                             "with --noise-floor; on in `toolaudit demo`)")
    if not f.calls:
        raise NothingToCheck(f"run {run_id} shares no matched call with its noise floor (run {f.floor_run_id})")
    (j,) = bounds.judge_floor(f, f"run {run_id}")
    sp = signed_points
    point = "" if j.rule is Rule.POINT else f"point {sp(j.estimate)}, "
    return Check("excess", j.ok, f"{j.what} {sp(j.figure)} {'<=' if j.ok else '>'} max {sp(j.threshold)} "
                                 f"({point}95% CI {sp(j.low)} to {sp(j.high)}; {f.only_candidate} drifted on the "
                                 f"candidate only, {f.only_floor} on the floor {f.floor_path} only, paired on "
                                 f"{f.calls} calls)", judged=j,
                 detail={"floor_run_id": f.floor_run_id, "only_candidate": f.only_candidate,
                         "only_floor": f.only_floor, "both": f.both, "paired_calls": f.calls})


def _sampled_checks(store: Store, run_id: int, bounds: Bounds) -> list[Check]:
    """--max-shifted-calls and --max-valid-drop on a sampled run (`analysis/sampled.py`); a usage error on any
    other run, NothingToCheck on one with no call tested."""
    from toolaudit.analysis.sampled import NotSampled, sampled_gate

    flags = " and ".join(f for f, v in (("--max-shifted-calls", bounds.max_shifted_calls),
                                        ("--max-valid-drop", bounds.max_valid_drop)) if v is not None)
    try:
        sampled = sampled_gate(store, run_id)
    except NotSampled as exc:
        raise GateUsageError(f"{flags}: {exc}") from None
    checks = []
    if bounds.max_shifted_calls is not None:
        rate = sampled.shifted
        if rate.n == 0:
            raise NothingToCheck(f"run {run_id}: no sampled call has 2 usable samples a side; no distribution "
                                 "test to check")
        j = judge_shifted(rate, bounds.max_shifted_calls, bounds.rule)
        check = _judged(j)
        checks.append(replace(check, message=f"{check.message}: {rate.k} of {rate.n} calls tested shifted "
                                             "(distribution_shift, BH q=0.05)",
                              detail={"shifted_calls": rate.k, "calls_tested": rate.n, "q": 0.05}))
    if bounds.max_valid_drop is not None:
        drop = sampled.valid_drop
        if drop is None:
            raise NothingToCheck(f"run {run_id}: no sampled call has usable samples on both sides; no schema-valid "
                                 "rate to check")
        j = judge_drop("valid_drop", "schema-valid drop", *drop, bounds.max_valid_drop, bounds.rule)
        v = sampled.valid
        point = "" if j.rule is Rule.POINT else f"point {pct(j.estimate)}, "
        checks.append(Check("valid_drop", j.ok, f"{j.what} {pct(j.figure)} {'<=' if j.ok else '>'} max "
                            f"{pct(j.threshold)} ({point}95% CI {pct(j.low)} to {pct(j.high)}): baseline "
                            f"{pct(v.baseline)} -> candidate {pct(v.candidate)}, paired over {v.calls} calls",
                            judged=j, detail={"baseline": v.baseline, "candidate": v.candidate, "calls": v.calls}))
    return checks
