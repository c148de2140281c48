"""The canary's history: one row per run of a path pair over time, with the change that explains a jump.

Each row is a run (a replay, a comparison of two logs, a Batch import, or one candidate of a remedy matrix) with
its drift and 95% Wilson interval (`figures.slice_figures`, as `summary` and reports compute them), the
compounded session drift, the candidate's acceptance and both paths' tokens/s, the noise floor where the run has
one (`floor.py`), and the budget judged by the gate's rule (`rules.py`). Against the previous run of the same
path pair it says what changed in the runtime:

- **config**: a path's config fingerprint differs; the components that changed are named from the ones each run
  stores in its options (`<side>_fingerprint_components`); a run stored without them reads "config changed
  (components not recorded)". Runs without fingerprints (two recorded logs) have no config to compare.
- **decisions** / **numerics**: the path's probe (`probes`, recorded with the run) chose other tokens, or returned
  other logprobs for the same tokens. Probes are compared by path name, and only on the same probe set.

The drift change from the previous run comes with Newcombe's interval (`stats.newcombe`): a jump whose interval
holds 0 is within sampling noise; one that excludes it and has no recorded change is the traffic's, or a change
nothing recorded. A customer's history (`customer`) reads only that customer's calls in every figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from toolaudit import RunNotFound
from toolaudit.analysis.figures import recorded_session_lengths, slice_figures
from toolaudit.analysis.floor import floor_figures, is_noise_floor, paired_keys
from toolaudit.analysis.gate_checks import changed_components
from toolaudit.analysis.rules import DEFAULT_RULE, Rule, judge_calls
from toolaudit.analysis.runs import run_options
from toolaudit.analysis.stats import newcombe, wilson
from toolaudit.store import Store
from toolaudit.store import history as hq

SIDES = ("candidate", "baseline")
CONFIG, DECISIONS, NUMERICS = "config", "decisions", "numerics"
CHANGE_KINDS = (CONFIG, DECISIONS, NUMERICS)
NOT_RECORDED = "config changed (components not recorded)"


@dataclass(frozen=True)
class Change:
    """One thing that changed in a path's runtime since the previous run of the same path pair."""

    kind: str  # config | decisions | numerics
    side: str  # candidate | baseline
    path_name: str
    components: tuple[tuple[str, Any, Any], ...] = ()  # config: (component, before, after)
    recorded: bool = True  # config: both runs stored their components

    @property
    def what(self) -> str:
        """The change without the path: `config speculative.num_speculative_tokens 4 -> 8`, `probe decisions
        changed`."""
        if self.kind == CONFIG:
            if not self.recorded:
                return NOT_RECORDED
            if not self.components:
                return "config fingerprint changed, stored components identical"
            return "config " + ", ".join(f"{name} {_short(old)} -> {_short(new)}" for name, old, new in self.components)
        if self.kind == DECISIONS:
            return "probe decisions changed (other greedy tokens)"
        return "probe numerics changed (other logprobs, same tokens)"

    @property
    def words(self) -> str:
        return f"{self.side} {self.path_name}: {self.what}"

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "side": self.side, "path_name": self.path_name,
                "components": [{"component": n, "before": o, "after": a} for n, o, a in self.components]
                if self.kind == CONFIG and self.recorded else None,
                "components_recorded": self.recorded if self.kind == CONFIG else None, "words": self.words}


@dataclass
class HistoryRow:
    """One run in the history, its figures and what changed since the previous run of its path pair."""

    run: dict[str, Any]
    figures: dict[str, Any]
    probes: dict[str, dict[str, Any] | None]  # side -> the probe recorded with the run, or None
    unavailable: dict[str, str] = field(default_factory=dict)  # side -> why its probe could not be taken
    previous_run_id: int | None = None
    drift_change: dict[str, float] | None = None
    changes: list[Change] = field(default_factory=list)

    @property
    def run_id(self) -> int:
        return self.run["run_id"]

    @property
    def change_words(self) -> str:
        if self.previous_run_id is None:
            return "first run of this path pair"
        if self.changes:
            sides = [(side, [c for c in self.changes if c.side == side]) for side in SIDES]
            return "; ".join(f"{side} {mine[0].path_name}: " + ", ".join(c.what for c in mine)
                             for side, mine in sides if mine)
        return "no recorded change"

    def as_dict(self) -> dict[str, Any]:
        run, f = self.run, self.figures
        created = run["created_at"]
        out: dict[str, Any] = {
            "run_id": run["run_id"], "run_name": run["name"], "kind": run["kind"], "status": run["status"],
            "created_at": created.isoformat(sep=" ", timespec="seconds") if created else None,
            "matrix_id": run["matrix_id"], "baseline": run["baseline_name"], "candidate": run["candidate_name"],
            "baseline_fingerprint": run["baseline_fingerprint"],
            "candidate_fingerprint": run["candidate_fingerprint"], **f}
        for side in SIDES:
            probe = self.probes.get(side) or {}
            out[f"{side}_probe_decisions"] = probe.get("decisions")
            out[f"{side}_probe_numerics"] = probe.get("numerics")
            out[f"{side}_probe_stable"] = probe.get("stable")
            out[f"{side}_probe_unavailable"] = self.unavailable.get(side)
        d = self.drift_change
        out.update({
            "previous_run_id": self.previous_run_id,
            "drift_change": None if d is None else d["estimate"],
            "drift_change_low": None if d is None else d["low"],
            "drift_change_high": None if d is None else d["high"],
            "config_changed": any(c.kind == CONFIG for c in self.changes),
            "decisions_changed": any(c.kind == DECISIONS for c in self.changes),
            "numerics_changed": any(c.kind == NUMERICS for c in self.changes),
            "changes": [c.as_dict() for c in self.changes], "change": self.change_words})
        return out


@dataclass
class Series:
    """The runs of one path pair, oldest first."""

    baseline: str
    candidate: str
    rows: list[HistoryRow]

    def as_dict(self) -> dict[str, Any]:
        return {"baseline": self.baseline, "candidate": self.candidate, "rows": [r.as_dict() for r in self.rows]}


@dataclass
class History:
    customer: str | None
    budget: float | None
    budget_source: str | None  # "--budget" (or the option that gave it), None without a budget
    rule: Rule
    series: list[Series]

    @property
    def rows(self) -> list[HistoryRow]:
        """Every run of every path pair, oldest first."""
        return sorted((r for s in self.series for r in s.rows), key=lambda r: r.run_id)

    def as_dict(self) -> dict[str, Any]:
        return {"customer": self.customer, "budget": self.budget, "budget_source": self.budget_source,
                "rule": self.rule.value, "series": [s.as_dict() for s in self.series]}


def history(store: Store, path_pair: Sequence[str] | None = None, customer: str | None = None,
            budget: float | None = None, budget_source: str | None = "--budget",
            rule: Rule = DEFAULT_RULE) -> History:
    """The history of every path pair in the database (or of `path_pair`, (baseline, candidate)); with
    `customer`, of that customer's calls only. The noise floor of a remedy matrix (the baseline decoded again
    beside the candidates) is not a row of its own unless its pair is asked for: it is the floor column of the
    candidates measured with it. A run of the baseline against itself on its own is a row."""
    baseline, candidate = path_pair if path_pair else (None, None)
    every = [] if path_pair else hq.history_runs(store)
    with_candidates = {r["matrix_id"] for r in every if r["matrix_id"] is not None and not is_noise_floor(r)}
    floors = {r["run_id"] for r in every if r["matrix_id"] in with_candidates and is_noise_floor(r)}
    runs = [r for r in hq.history_runs(store, baseline, candidate, customer) if r["run_id"] not in floors]
    wanted = sorted({r["run_id"] for r in runs} | {r["matrix_id"] for r in runs if r["matrix_id"] is not None})
    probes: dict[tuple[int, str, str], dict[str, Any]] = {}
    for p in hq.probes_for_runs(store, wanted) if wanted else []:
        probes[(p["run_id"], p["side"], p["path_name"])] = p  # oldest first: the latest probe wins
    if not runs:
        raise RunNotFound(_nothing(store, path_pair, customer))
    pairs: dict[tuple[str, str], list[HistoryRow]] = {}
    for run in runs:
        row = HistoryRow(run, _figures(store, run, customer, budget, rule), _run_probes(run, probes),
                         unavailable=_unavailable(store, run))
        series = pairs.setdefault((run["baseline_name"], run["candidate_name"]), [])
        if series:
            _explain(row, series[-1])
        series.append(row)
    return History(customer, budget, budget_source if budget is not None else None, rule,
                   [Series(b, c, rows) for (b, c), rows in pairs.items()])


def _nothing(store: Store, path_pair: Sequence[str] | None, customer: str | None) -> str:
    """Why a history is empty, with the path pairs the database has."""
    known = list(dict.fromkeys(f"{r['baseline_name']} {r['candidate_name']}" for r in hq.history_runs(store)))
    what = "no runs" + (f" of {path_pair[0]} vs {path_pair[1]}" if path_pair else "")
    what += f" with calls of customer {customer!r}" if customer is not None else ""
    if not known:
        return f"{store.path}: {what}; run `toolaudit replay` or `compare` first"
    listed = "; ".join(known[:5]) + ("; ..." if len(known) > 5 else "")
    return f"{store.path}: {what} (path pairs: {listed}; see `toolaudit runs`)"


def _unavailable(store: Store, run: dict) -> dict[str, str]:
    """Side -> why the run's probe of that side's path could not be taken (`store.probes`)."""
    from toolaudit.store.probes import run_unavailable_probes

    out: dict[str, str] = {}
    for entry in run_unavailable_probes(store, run):
        out.setdefault(entry["side"], entry["reason"])
    return out


def _run_probes(run: dict, probes: dict[tuple[int, str, str], dict]) -> dict[str, dict | None]:
    """Each side's probe: recorded with the run itself or, for a matrix candidate, with its matrix run."""
    found: dict[str, dict | None] = {}
    for side in SIDES:
        name = run[f"{side}_name"]
        hits = [probes.get((rid, side, name)) for rid in (run["run_id"], run["matrix_id"]) if rid is not None]
        found[side] = next((h for h in hits if h is not None), None)
    return found


def _figures(store: Store, run: dict, customer: str | None, budget: float | None, rule: Rule) -> dict[str, Any]:
    rid = run["run_id"]
    f = slice_figures(store, rid, customer)
    rate = f.rate
    session = f.compounded_own_rates if customer is not None else f.compounded_run_rates
    speed = _speed(store, rid, customer)
    floor = floor_figures(store, rid, customer)
    shared = floor if floor is not None and floor.calls else None  # the floor figures on calls both matched
    judged = judge_calls(rate, budget, rule) if budget is not None and rate.n else None
    return {
        "calls": rate.n, "drifted_calls": rate.k, "drift_rate": rate.p if rate.n else None,
        "ci_low": rate.low if rate.n else None, "ci_high": rate.high if rate.n else None,
        "session_drift": session, "observed_session_drift": f.observed_session_drift, "sessions": f.sessions,
        # `session_drift` named as every other view names it (a customer's: its own tool rates)
        ("compounded_session_drift_own_rates" if customer is not None else "compounded_session_drift_run_rates"):
            session,
        "calls_per_session_replayed": f.mean_calls_per_session if f.sessions else None,
        "calls_per_session_recorded": recorded_session_lengths(store, run).get(customer or "(all)"),
        **speed,
        "floor_run_id": None if floor is None else floor.floor_run_id,
        "floor_drift_rate": None if shared is None else shared.floor.p,
        "floor_ci_low": None if shared is None else shared.floor.low,
        "floor_ci_high": None if shared is None else shared.floor.high,
        **paired_keys(shared),
        "budget": budget, "within_budget": None if judged is None else judged.ok}


def _speed(store: Store, rid: int, customer: str | None) -> dict[str, Any]:
    """Tokens/s of both paths and the candidate's acceptance, as every command shows them (`analysis.speed`)."""
    from toolaudit.analysis.speed import speed

    figures = speed(store, rid, customer).as_dict()
    return {k: figures[k] for k in ("acceptance_rate", "baseline_tokens_per_s", "candidate_tokens_per_s", "speedup",
                                    "prefill_charged")}


def _explain(row: HistoryRow, before: HistoryRow) -> None:
    """What changed between the previous run of the path pair and this one: config components, probes, and the
    drift change with its interval."""
    row.previous_run_id = before.run_id
    new, old = row.figures, before.figures
    if new["calls"] and old["calls"]:
        d = newcombe(wilson(new["drifted_calls"], new["calls"]), wilson(old["drifted_calls"], old["calls"]))
        row.drift_change = {"estimate": d.estimate, "low": d.low, "high": d.high}
    now, then = run_options(row.run), run_options(before.run)
    for side in SIDES:
        name = row.run[f"{side}_name"]
        fp_new, fp_old = row.run[f"{side}_fingerprint"], before.run[f"{side}_fingerprint"]
        if fp_new and fp_old and fp_new != fp_old:
            comps_new, comps_old = now.get(f"{side}_fingerprint_components"), then.get(f"{side}_fingerprint_components")
            if isinstance(comps_new, dict) and isinstance(comps_old, dict):
                row.changes.append(Change(CONFIG, side, name, tuple(changed_components(comps_old, comps_new))))
            else:
                row.changes.append(Change(CONFIG, side, name, recorded=False))
        p_new, p_old = row.probes.get(side), before.probes.get(side)
        if p_new is None or p_old is None or p_new["probe_set"] != p_old["probe_set"]:
            continue
        if p_new["decisions"] != p_old["decisions"]:
            row.changes.append(Change(DECISIONS, side, name))
        elif p_new["numerics"] is not None and p_old["numerics"] is not None and p_new["numerics"] != p_old["numerics"]:
            row.changes.append(Change(NUMERICS, side, name))


def _short(value: Any) -> str:
    """A component's value as a change reads it: strings bare, the rest as JSON, cut at 60 characters."""
    text = value if isinstance(value, str) else orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    return text if len(text) <= 60 else text[:57] + "..."
