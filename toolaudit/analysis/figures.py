"""The run's headline figures, computed in one place for `summary`, the `check` gate and reports.

Two compounded session figures exist and are named apart (see `store.queries.slice_counts`):
`compounded_run_rates` applies the run-wide per-tool drift rates to each session (the `sessions` table; JSON
and SQL call it `compounded_session_drift_run_rates`); `compounded_own_rates` uses only the slice's own calls
(a customer's report: `compounded_session_drift_own_rates`). For a whole run they agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from toolaudit.analysis.runs import is_sampled, run_options, samples_per_call, sampling
from toolaudit.analysis.stats import Rate, expected_session_drift, wilson
from toolaudit.store import Store
from toolaudit.store import queries as q
from toolaudit.store.probes import run_unavailable_probes
from toolaudit.store.vocabulary import MatchStatus


@dataclass(frozen=True)
class SliceFigures:
    """Drift of a whole run, or of one customer's calls in it."""

    rate: Rate  # drifted calls out of matched calls, with a 95% Wilson interval
    exact_text_matches: int
    sessions: int  # sessions with at least one matched call
    sessions_with_drift: int
    mean_calls_per_session: float
    compounded_run_rates: float | None
    compounded_own_rates: float | None

    @property
    def observed_session_drift(self) -> float | None:
        return self.sessions_with_drift / self.sessions if self.sessions else None


def slice_figures(store: Store, run_id: int, customer: str | None = None) -> SliceFigures:
    row = q.slice_counts(store, run_id, customer)

    def num(value: Any) -> float | None:
        return None if value is None else float(value)

    return SliceFigures(wilson(row["drifted_calls"], row["calls"]), row["exact_text_matches"], row["sessions"],
                        row["sessions_with_drift"], float(row["mean_calls_per_session"] or 0.0),
                        num(row["compounded_run_rates"]), num(row["compounded_own_rates"]))


@dataclass(frozen=True)
class RunFigures:
    """The whole run's drift, with what the gate needs to explain itself (status, fingerprint, options)."""

    run_id: int
    name: str
    status: str
    figures: SliceFigures
    candidate_fingerprint: str | None
    options: dict[str, Any]

    @property
    def rate(self) -> Rate:
        return self.figures.rate

    @property
    def sessions(self) -> int:
        return self.figures.sessions

    @property
    def sessions_with_drift(self) -> int:
        return self.figures.sessions_with_drift

    @property
    def mean_calls_per_session(self) -> float:
        return self.figures.mean_calls_per_session

    @property
    def observed_session_drift(self) -> float:
        return self.figures.observed_session_drift or 0.0


def run_figures(store: Store, run_id: int | None) -> RunFigures:
    run = store.run_row(run_id)
    return RunFigures(run["run_id"], run["name"], run["status"], slice_figures(store, run["run_id"]),
                      run["candidate_fingerprint"], run_options(run))


def run_summary(store: Store, run_id: int | None = None) -> dict[str, Any]:
    """Headline numbers of one run (the latest by default), as plain data for the CLI (`summary --json`)."""
    run = store.run_row(run_id)
    rid = run["run_id"]
    f = slice_figures(store, rid)
    unmatched = q.status_counts(store, rid)
    paths = _paths(store, rid)
    by_side = {p["side"]: p for p in paths}
    speedup = None
    if by_side.get("baseline", {}).get("tokens_per_s") and by_side.get("candidate", {}).get("tokens_per_s"):
        speedup = by_side["candidate"]["tokens_per_s"] / by_side["baseline"]["tokens_per_s"]
    margins = q.margin_evidence(store, rid)
    counts = orjson.loads(run["counts"]) if run["counts"] else None
    fold = folds_unknown_tools(run)
    recorded = recorded_session_lengths(store, run)
    return {
        "run_id": rid,
        "run_name": run["name"],
        "status": run["status"],
        "baseline": run["baseline_name"],
        "candidate": run["candidate_name"],
        "calls": f.rate.n,
        "drifted_calls": f.rate.k,
        "drift_rate": f.rate.p,
        "ci_low": f.rate.low,
        "ci_high": f.rate.high,
        "exact_text_matches": f.exact_text_matches,
        "drift_kinds": q.drift_kind_counts(store, rid),
        "unmatched_calls": {"baseline_only": unmatched.get("baseline_only", 0),
                            "candidate_only": unmatched.get("candidate_only", 0)},
        # paired, stored, and left out of every figure above (compare.attribution)
        "not_compared": {"truncated": unmatched.get(MatchStatus.TRUNCATED.value, 0),
                         "mismatched": unmatched.get(MatchStatus.MISMATCHED.value, 0)},
        "error_rows": q.trace_error_count(store, rid),
        "first_errors": q.first_trace_errors(store, rid),
        "errors_sql": q.trace_errors_sql(rid),
        "skipped": skipped_records(counts),
        "schema_problems": dict(zip(("count", "first"), q.schema_problems(store, rid))),
        "schema_issues_sql": q.schema_issues_sql(rid),
        "sessions": f.sessions,
        "sessions_with_drift": f.sessions_with_drift,
        "observed_session_drift": f.observed_session_drift or 0.0,
        # run-wide per-tool rates; equal to the run's own rates (see module docstring)
        "compounded_session_drift_run_rates": f.compounded_run_rates or 0.0,
        "compounded_session_drift": f.compounded_run_rates or 0.0,  # deprecated name (one release)
        "mean_calls_per_session": f.mean_calls_per_session,
        # the two session lengths, named apart everywhere they appear (`session_lengths`)
        "calls_per_session_replayed": f.mean_calls_per_session,
        "calls_per_session_recorded": recorded.get("(all)"),
        "expected_session_drift": [{"calls": n, "p": p} for n, p in expected_session_drift(f.rate.p)],
        "paths": paths,
        "speedup": speedup,
        "drifted_with_token_evidence": margins["with_evidence"],
        "median_drift_margin": margins["median_margin"],
        "worst_example": q.worst_example(store, rid),
        "customers": _with_lengths(_with_floors(store, rid, q.customer_rows(store, rid)), store, rid, recorded),
        "counts": counts,
        "noise_floor_run": _is_floor_run(run),
        "tool_key": tool_key(store, run),
        "tools": [tool_row(t["tool_name"], t["calls"], t["drifted_calls"])
                  for t in q.tool_rows(store, rid, fold_unknown_tools=fold)],
        "noise_floor": _floor(store, rid, fold_unknown_tools=fold),
        "sampling": sampling(run),
        # probes the replay could not take ({run_id, side, path_name, reason}): said, not silently missing
        "probes_unavailable": run_unavailable_probes(store, run),
        **_sampled(store, run),
    }


def _paths(store: Store, run_id: int) -> list[dict[str, Any]]:
    """The run's paths (`path_performance`: calls, wall time, errors) with the speed every view shows
    (`analysis.speed`) where the run has one."""
    from toolaudit.analysis.speed import speed

    figures = speed(store, run_id)
    paths = q.path_rows(store, run_id)
    if figures.baseline_tokens_per_s is None and figures.candidate_tokens_per_s is None:
        return paths
    for p in paths:
        p["tokens_per_s"] = getattr(figures, f"{p['side']}_tokens_per_s")
        if p["side"] == "candidate":
            p["acceptance_rate"], p["tokens_per_forward_pass"] = (figures.acceptance_rate,
                                                                  figures.tokens_per_forward_pass)
    return paths


def recorded_session_lengths(store: Store, run: dict) -> dict[str, float]:
    """The traces' own mean calls per session (`{"(all)": ..., customer: ...}`), stored by a replay that sampled
    calls (on its matrix run when it has one); {} for other runs. Beside it every view shows the length as
    replayed (matched calls per session in the run): two figures, two names."""
    lengths = run_options(run).get("trace_session_calls")
    if lengths is None and run.get("matrix_id") is not None:
        lengths = run_options(store.run_row(run["matrix_id"])).get("trace_session_calls")
    return dict(lengths or {})


def _with_lengths(customers: list[dict[str, Any]], store: Store, run_id: int,
                  recorded: dict[str, float]) -> list[dict[str, Any]]:
    """Each customer's row with both session lengths (replayed: its matched calls per session here)."""
    replayed = {r["customer"]: r["calls_per_session"] for r in q.customer_session_lengths(store, run_id)}
    for row in customers:
        row.update(calls_per_session_replayed=replayed.get(row["customer"]),
                   calls_per_session_recorded=recorded.get(row["customer"]))
    return customers


def _sampled(store: Store, run: dict) -> dict[str, Any]:
    """A sampled run's distribution figures (`analysis.sampled`): the headline three at the top level, all of
    them under `sampled`; for other runs one sample per call and no test."""
    if not is_sampled(run):
        return {"samples_per_call": samples_per_call(run), "shifted_calls": None, "global_p": None, "sampled": None}
    from toolaudit.analysis.sampled import sampled_summary

    s = sampled_summary(store, run["run_id"])
    s["calibration"] = _calibration(store, run)
    return {"samples_per_call": s["samples_per_call"], "shifted_calls": s["shifted_calls"], "global_p": s["global_p"],
            "sampled": s}


def _calibration(store: Store, run: dict) -> dict[str, Any] | None:
    """A sampled run's calibration line: its matrix's noise floor (the baseline against itself with other seeds)
    under the same tests, which should shift no call and not reject globally. None without a sampled floor."""
    from toolaudit.analysis.floor import floor_member
    from toolaudit.analysis.sampled import sampled_summary

    member = floor_member(store, run["run_id"])
    if member is None or not is_sampled(member):
        return None
    f = sampled_summary(store, member["run_id"])
    return {"run_id": member["run_id"], "path": member["candidate_name"], "calls_tested": f["calls_tested"],
            "shifted_calls": f["shifted_calls"], "global_p": f["global_p"], "median_tv": f["median_tv"]}


def _is_floor_run(run: dict) -> bool:
    from toolaudit.analysis.floor import is_noise_floor

    return run["kind"] != "matrix" and is_noise_floor(run)


def tool_key(store: Store, run: dict) -> str:
    """What a run's per-tool rows (`tools`, `noise_floor.tools_keyed`, a report's `tools`) are keyed by:
    `recorded`, the recorded call's tool, where the run's calls name it (`calls.recorded_tool`: the trace's
    recorded response in a replay, the baseline log in a compare; `queries.tool_key_sql`) or the run is two
    recorded logs (a compare written before that column: the baseline log's tool name is the recorded call's);
    else `declared`: the baseline is a decode path (a replay written before that column, or of a trace without
    recorded tool calls; a Batch import) whose answer may name a tool nobody declared: its name where a schema
    knows it (the request's declared tools, --schema-dir), the rest in one `(other)` row."""
    return "recorded" if run["kind"] == "compare" or q.keyed_by_recorded_tool(store, run["run_id"]) else "declared"


def folds_unknown_tools(run: dict) -> bool:
    """Whether the per-tool rows that fall back on the baseline's tool name (rows without `recorded_tool`) fold
    the names no schema knows into `(other)`: where the baseline is a decode path, not a recorded log."""
    return run["kind"] != "compare"


def tool_row(name: str | None, calls: int, drifted: int) -> dict[str, Any]:
    """One tool's (or a group of tools') drifted calls with a 95% Wilson interval."""
    rate = wilson(drifted, calls)
    return {"tool_name": name, "calls": calls, "drifted_calls": drifted, "drift_rate": rate.p, "ci_low": rate.low,
            "ci_high": rate.high}


def fold_tool_rows(rows: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """Several `tool_row` (or `FloorFigures.tool_row`) rows as one named `name`: the figures of their calls
    together."""
    from toolaudit.analysis.floor import tool_floor

    calls = sum(r["calls"] for r in rows)
    if rows and "only_candidate" in rows[0]:
        return tool_floor(name, calls, *(sum(r[k] for r in rows)
                                         for k in ("only_candidate", "only_floor", "both"))).tool_row()
    return tool_row(name, calls, sum(r["drifted_calls"] for r in rows))


def _floor(store: Store, run_id: int, fold_unknown_tools: bool = False) -> dict[str, Any] | None:
    """The run beside its noise floor (`analysis.floor`): the whole run, with its tools (`tools`: by the baseline's
    tool name; `tools_keyed`: by the run's `tool_key`)."""
    from toolaudit.analysis.floor import floor_figures, floor_member, tool_floors

    member = floor_member(store, run_id)
    if member is None:
        return None
    tools = [t.tool_row() for t in tool_floors(store, run_id, member)]
    keyed = [t.tool_row() for t in tool_floors(store, run_id, member, fold_unknown_tools=fold_unknown_tools,
                                               by_recorded_tool=True)]
    return {**floor_figures(store, run_id, member=member).as_dict(), "tools": tools, "tools_keyed": keyed}


def _with_floors(store: Store, run_id: int, customers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each customer's row with its noise floor and the floor figures' paired keys (None without a floor)."""
    from toolaudit.analysis.floor import floor_figures, floor_member, paired_keys

    member = floor_member(store, run_id)
    for row in customers:
        f = None if member is None else floor_figures(store, run_id, row["customer"], member)
        row.update(floor_drift_rate=None if f is None else f.floor.p, **paired_keys(f))
    return customers


def skipped_records(counts: dict | None) -> dict[str, dict[str, Any]]:
    """Per side, the records skipped as not model calls and why (reasons are known for compare runs)."""
    out: dict[str, dict[str, Any]] = {}
    counts = counts or {}
    # a replay reads one set of files for both paths: its per-side counts are the same input, shown once
    sides = (("input", "baseline"),) if "replay" in counts else (("baseline", "baseline"), ("candidate", "candidate"))
    for label, side in sides:
        stats = counts.get(side)
        n = stats.get("skipped", 0) if isinstance(stats, dict) else 0
        if n:
            reasons = (counts.get("skipped_reasons") or {}).get(side) or {}
            out[label] = {"count": n, "reasons": dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))}
    return out
