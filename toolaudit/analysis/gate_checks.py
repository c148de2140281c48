"""The gate's checks that are not drift budgets (`budgets.py` judges those): one `Check` per bound `check` reports,
the error rows (calls missing from the figures could be the drifted ones), and the candidate's fingerprint with
the components that changed since the run that had the expected one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from toolaudit.analysis.figures import RunFigures
from toolaudit.analysis.regression import Regression
from toolaudit.analysis.rules import Judged
from toolaudit.analysis.runs import run_options
from toolaudit.store import Store
from toolaudit.store import queries as q


@dataclass(frozen=True)
class Check:
    """One bound: `message` reads as a violation (`call drift upper bound 2.09% > max 1.50%`) or as a pass.

    `name` is stable for machines (`call_drift`, `session_drift`, `increase`, `fingerprint`, `error_rows`);
    `judged` / `regression` carry the figures behind a drift or an --against check, `queries` the
    `toolaudit sql` statements that list what an error-row check counted."""

    name: str
    ok: bool
    message: str
    judged: Judged | None = None
    regression: Regression | None = None
    queries: tuple[str, ...] = ()
    detail: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The check as `check --json` prints it: figure, interval, threshold and rule for every kind."""
        out: dict[str, Any] = {"name": self.name, "ok": self.ok, "reason": self.message, "rule": None,
                               "figure": None, "estimate": None, "interval": None, "threshold": None}
        if self.judged is not None:
            out.update({k: v for k, v in self.judged.as_dict().items() if k not in ("name", "ok")})
        if self.regression is not None:
            r = self.regression
            d = r.difference
            out.update(rule="newcombe", figure=d.estimate, estimate=d.estimate, interval=[d.low, d.high],
                       threshold=r.max_increase, **r.as_dict())
        out.update(self.detail)
        if self.queries:
            out["queries"] = list(self.queries)
        return out


def error_rows(store: Store, run_id: int, allowed: int) -> Check:
    """Error rows fail the gate beyond `allowed`: calls missing from the figures could be the drifted ones."""
    unusable, failed = q.trace_error_count(store, run_id), q.error_call_count(store, run_id)
    total = unusable + failed
    detail = {"figure": total, "threshold": allowed, "rule": "count", "unusable_records": unusable,
              "failed_calls": failed}
    if total == 0:
        return Check("error_rows", True, "no error rows", detail=detail)
    parts = [f"{n} {what}" for n, what in ((unusable, "input records the readers could not use"),
                                          (failed, "calls an engine failed")) if n]
    ok = total <= allowed
    queries = tuple(sql for n, sql in ((unusable, q.trace_errors_sql(run_id)), (failed, q.error_calls_sql(run_id)))
                    if n)
    return Check("error_rows", ok, f"{total} error rows ({', '.join(parts)}) {'<=' if ok else '>'} allowed "
                                   f"{allowed} (--allow-errors N); the drift figures leave them out",
                 queries=queries, detail=detail)


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


def value_text(value: Any) -> str:
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    return text if len(text) <= 60 else text[:57] + "..."


def fingerprint_check(store: Store, figures: RunFigures, expected: str) -> Check:
    got = figures.candidate_fingerprint
    detail = {"rule": "match", "figure": got, "threshold": expected}
    if fingerprint_matches(got, expected):
        return Check("fingerprint", True, f"candidate fingerprint {got} matches", detail=detail)
    if not got:
        return Check("fingerprint", False,
                     f"candidate fingerprint not recorded for run {figures.run_id} (expected {expected})",
                     detail=detail)
    message = f"candidate fingerprint {got} != expected {expected}"
    now = figures.options.get("candidate_fingerprint_components")
    known = components_of(store, expected, figures.run_id) if isinstance(now, dict) else None
    if known is not None:
        run_id, before = known
        changes = changed_components(before, now)
        if changes:
            message += f"; changed since run {run_id}: " + ", ".join(
                f"{name} ({value_text(old)} -> {value_text(new)})" for name, old, new in changes)
    return Check("fingerprint", False, message, detail=detail)


def components_of(store: Store, fingerprint: str, exclude_run: int) -> tuple[int, dict] | None:
    """The stored components of the latest other run whose baseline or candidate has this fingerprint."""
    for run in q.other_runs_fingerprints(store, exclude_run):
        options = run_options(run)
        for side in ("candidate", "baseline"):
            components = options.get(f"{side}_fingerprint_components")
            if fingerprint_matches(run[f"{side}_fingerprint"], fingerprint) and isinstance(components, dict):
                return run["run_id"], components
    return None
