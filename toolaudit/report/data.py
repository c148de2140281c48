"""The data behind one customer's drift report, built from one run in the store as plain JSON-ready dicts.

Isolation: every figure in a customer's report comes from queries filtered to that customer's calls. Nothing
run-wide that could carry another customer's data (session ids, argument values, counts, trace errors,
schema issues) is read; the noise floor and compounded session drift are recomputed from the customer's own
calls.

Near-tie threshold (`near_tie_margin`, default 1.0 logit): a drifted call whose baseline top-1 minus top-2
margin at the first divergent token is below it is attributed to numerics, above it to a possible decode-path
bug. In bf16, logits of magnitude 16-32 are spaced 0.125 apart and a different reduction order (a batched
verification pass against one-token steps) moves them by a few such steps, i.e. a few tenths of a logit; a
1-logit lead (the top token about 2.7 times as likely as the runner-up) is beyond that noise yet far below
the margins of confident tokens. Logit and logprob margins are the same number (softmax is shift-invariant).
Calibrate it with a noise-floor run: the report shows the largest margin among its drifted calls.

The queries live in the store (`store.report_queries`, one function each); this module only shapes rows.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from toolaudit import ToolauditError, __version__
from toolaudit.analysis.figures import (
    folds_unknown_tools,
    recorded_session_lengths,
    run_options,
    slice_figures,
    tool_key,
)
from toolaudit.analysis.floor import floor_figures, is_noise_floor, paired_keys
from toolaudit.analysis.gate_checks import flatten
from toolaudit.analysis.routing import routing_advice
from toolaudit.analysis.runs import is_sampled, samples_per_call, sampling
from toolaudit.analysis.sampled import customer_sampled
from toolaudit.analysis.speed import speed
from toolaudit.analysis.stats import Rate, expected_session_drift, wilson
from toolaudit.store import Store
from toolaudit.store import report_queries as rq
from toolaudit.store.queries import drift_kind_counts, status_counts
from toolaudit.store.report_queries import KIND_COLUMNS
from toolaudit.store.vocabulary import MatchStatus

# KIND_COLUMNS: the per-tool rows' drift-kind columns, in DriftKind declaration order; the "kinds" text lists
# them in the same order. Plain strings: they name SQL columns and JSON keys.
__all__ = ["KIND_COLUMNS", "ReportError", "ReportOptions", "customer_report", "customers_of", "is_noise_floor",
           "margin_bins", "slugs"]
MARGIN_EDGES = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
VALUE_LIMIT = 300  # characters of an argument value or output shown in examples


class ReportError(ToolauditError):
    """A report cannot be built as asked (unknown customer, unknown format)."""


@dataclass(frozen=True)
class ReportOptions:
    near_tie_margin: float = 1.0
    max_call_drift: float | None = None
    max_session_drift: float | None = None
    session_calls: float | None = None  # default: the customer's mean calls per session
    top_arguments: int = 15
    examples: int = 8
    table_rows: int = 20  # per-tool rows shown in HTML/Markdown (JSON has them all)
    max_shifted_calls: float | None = None  # a sampled matrix's remedy reports: the budget on shifted calls


def customers_of(store: Store, run_id: int) -> list[str]:
    return rq.customers(store, run_id)


def slugs(customers: Sequence[str]) -> dict[str, str]:
    """File-name-safe, unique slugs; a short hash disambiguates names that collapse to the same slug."""
    def base(name: str) -> str:
        return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:60] or "customer"

    plain = [base(c) for c in customers]
    out = {}
    for name, slug in zip(customers, plain):
        if plain.count(slug) > 1 or slug == "customer":
            slug = f"{slug}-{hashlib.sha1(name.encode()).hexdigest()[:6]}"
        out[name] = slug
    return out


def margin_bins(threshold: float) -> list[tuple[float, float]]:
    edges = sorted(set(MARGIN_EDGES) | {threshold})
    return [(lo, hi) for lo, hi in zip(edges, edges[1:] + [float("inf")])]


# -- the report -----------------------------------------------------------------------------------------

def customer_report(store: Store, run_id: int | None, customer: str,
                    options: ReportOptions | None = None) -> dict[str, Any]:
    """Everything one customer's report shows, as plain JSON-ready data."""
    options = options or ReportOptions()
    run = store.run_row(run_id)
    rid = run["run_id"]
    head = _headline(store, rid, customer)
    if not any(head[k] for k in ("calls", "unmatched_calls", "error_calls", "truncated_calls", "mismatched_calls")):
        raise ReportError(f"customer {customer!r} has no calls in run {rid}")
    recorded = recorded_session_lengths(store, run).get(customer)
    head["calls_per_session_recorded"] = recorded
    head.update(speed(store, rid, customer).as_dict())  # the figures every view shows (`analysis.speed`)
    # the session length routing advice is judged at, picked as `frontier` and `check` pick it
    session_calls = options.session_calls or recorded or head["mean_calls_per_session"] or 1.0
    rate = wilson(head["drifted_calls"], head["calls"])
    tools = _tools(store, rid, customer, folds_unknown_tools(run))
    report = {
        "report": {"toolaudit_version": __version__,
                   "generated_at": dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()},
        "customer": customer,
        "run": _run_info(run),
        "settings": {"near_tie_margin": options.near_tie_margin, "max_call_drift": options.max_call_drift,
                     "max_session_drift": options.max_session_drift, "session_calls": session_calls,
                     "table_rows": options.table_rows},
        "headline": head,
        "paths": _paths(store, rid, customer, run, head),
        "noise_floor": _noise_floor(store, rid, customer),
        "tool_key": tool_key(store, run),  # what `tools` is keyed by, as in `summary`
        "tools": tools,
        "arguments": _arguments(store, rid, customer, options.top_arguments),
        "session_length": _session_length(rate),
        "margins": _margins(store, rid, customer, options.near_tie_margin),
        "examples": _examples(store, rid, customer, options),
        "routing": None,
        "sampling": _sampling(run),
        "sampled": customer_sampled(store, rid, customer) if is_sampled(run) else None,
    }
    if options.max_call_drift is not None or options.max_session_drift is not None:
        by_traffic = sorted(tools, key=lambda t: (-t["calls"], t["tool_name"]))
        scopes = [("all tools", rate)] + [(t["tool_name"], wilson(t["drifted_calls"], t["calls"]))
                                          for t in by_traffic]
        report["routing"] = {
            "session_calls": session_calls,
            "rows": [asdict(routing_advice(scope, r, options.max_call_drift, options.max_session_drift,
                                           session_calls)) for scope, r in scopes]}
    return report


def _session_length(rate: Rate) -> list[dict[str, float]]:
    """Expected share of sessions with drift for 1..10 calls, with the interval carried through."""
    curves = [expected_session_drift(x) for x in (rate.p, rate.low, rate.high)]
    return [{"calls": n, "p": p, "low": lo, "high": hi} for (n, p), (_, lo), (_, hi) in zip(*curves)]


def _sampling(run: dict) -> dict[str, Any] | None:
    """How the run's answers were drawn when at temperature > 0 (or sampled N times per call): its greedy figures
    (drift, sessions, examples) then compare one sample of each side, sample 0 of a sampled run, and measure
    sampling noise, not drift; the `sampled` section tests the distributions. None for greedy runs."""
    drawn = sampling(run)
    if not is_sampled(run) and not (drawn and drawn["sampling_noise"]):
        return None
    return {"temperature": drawn["temperature"] if drawn else run_options(run).get("temperature"),
            "samples_per_call": samples_per_call(run), "sampling_noise": True,
            "greedy_figures": "sample 0 of each side" if is_sampled(run) else "one sample of each side"}


def _run_info(run: dict) -> dict[str, Any]:
    opts = run_options(run)
    info = {k: run[k] for k in ("run_id", "name", "kind", "status", "baseline_name", "candidate_name",
                                "baseline_fingerprint", "candidate_fingerprint", "toolaudit_version")}
    created = run["created_at"]
    info["created_at"] = created.isoformat(sep=" ", timespec="seconds") if created else None
    info["noise_floor_run"] = is_noise_floor(run)
    for side in ("baseline", "candidate"):
        comps = opts.get(f"{side}_fingerprint_components")
        info[f"{side}_fingerprint_components"] = flatten(comps) if isinstance(comps, dict) else None
    return info


def _headline(store: Store, rid: int, customer: str) -> dict[str, Any]:
    """The customer's figures (`figures.slice_figures`): `compounded_session_drift_own_rates` from the
    customer's OWN per-tool rates, so a report never depends on other customers' traffic, and beside it
    `compounded_session_drift_run_rates` from the run-wide rates (what `summary` shows). `compounded_session_drift`
    is the deprecated name of the own-rates figure, kept for one release."""
    f = slice_figures(store, rid, customer)
    statuses = status_counts(store, rid, customer)
    rate = f.rate
    return {"calls": rate.n, "drifted_calls": rate.k, "drift_rate": rate.p, "ci_low": rate.low,
            "ci_high": rate.high, "exact_text_matches": f.exact_text_matches,
            "unmatched_calls": statuses.get(MatchStatus.BASELINE_ONLY.value, 0)
            + statuses.get(MatchStatus.CANDIDATE_ONLY.value, 0),
            "error_calls": statuses.get(MatchStatus.ERROR.value, 0),
            "truncated_calls": statuses.get(MatchStatus.TRUNCATED.value, 0),
            "mismatched_calls": statuses.get(MatchStatus.MISMATCHED.value, 0),
            "drift_kinds": drift_kind_counts(store, rid, customer), "sessions": f.sessions,
            "sessions_with_drift": f.sessions_with_drift, "observed_session_drift": f.observed_session_drift,
            "compounded_session_drift_own_rates": f.compounded_own_rates,
            "compounded_session_drift_run_rates": f.compounded_run_rates,
            "compounded_session_drift": f.compounded_own_rates,  # deprecated name (one release)
            "mean_calls_per_session": f.mean_calls_per_session if f.sessions else None,
            "calls_per_session_replayed": f.mean_calls_per_session if f.sessions else None}


def _paths(store: Store, rid: int, customer: str, run: dict, head: dict) -> list[dict[str, Any]]:
    """The trade-off table: agreement and speed per decode path, NULL-safe for recorded logs."""
    rows = {r["side"]: r for r in rq.path_rows(store, rid, customer)}
    figures = speed(store, rid, customer)  # one definition of tokens/s and acceptance for every view
    out = []
    for side in ("baseline", "candidate"):
        r = rows.get(side, {})
        tps = getattr(figures, f"{side}_tokens_per_s")
        reference = side == "baseline"
        out.append({
            "side": side, "path_name": r.get("path_name") or run[f"{side}_name"],
            "fingerprint": run[f"{side}_fingerprint"], "calls": head["calls"],
            "exact_match_rate": None if reference or not head["calls"] else
            head["exact_text_matches"] / head["calls"],
            "tool_call_mismatch_rate": None if reference or not head["calls"] else head["drift_rate"],
            "tokens_per_s": tps,
            "acceptance_rate": None if reference else figures.acceptance_rate,
            "errors": r.get("errors", 0)})
    return out


def _noise_floor(store: Store, rid: int, customer: str) -> dict[str, Any] | None:
    """The run's own noise floor (the baseline decoded again in the same replay, `--noise-floor`) with the floor
    figures' paired keys; else the latest other noise-floor run, measured on this customer's calls only; None when
    none covers it."""
    own = floor_figures(store, rid, customer)
    if own is not None and own.calls:
        run = store.run_row(own.floor_run_id)
        calls, drifted, exact, top_margin = rq.matched_counts(store, own.floor_run_id, customer)
        return {"run_id": own.floor_run_id, "run_name": run["name"],
                "created_at": run["created_at"].isoformat(sep=" ", timespec="seconds"),
                "path_name": own.floor_path, "calls": own.calls, "drifted_calls": own.floor.k,
                "drift_rate": own.floor.p, "ci_low": own.floor.low, "ci_high": own.floor.high,
                "ci_width": own.floor.width, "exact_match_rate": exact / calls if calls else None,
                "max_drift_margin": top_margin, **paired_keys(own, counts=True)}
    candidates = [r for r in rq.other_runs(store, rid) if is_noise_floor(r)]
    for run in candidates:
        calls, drifted, exact, top_margin = rq.matched_counts(store, run["run_id"], customer)
        if calls:
            rate = wilson(drifted, calls)
            return {"run_id": run["run_id"], "run_name": run["name"],
                    "created_at": run["created_at"].isoformat(sep=" ", timespec="seconds"),
                    "path_name": run["baseline_name"], "calls": calls, "drifted_calls": drifted,
                    "drift_rate": rate.p, "ci_low": rate.low, "ci_high": rate.high, "ci_width": rate.width,
                    "exact_match_rate": exact / calls, "max_drift_margin": top_margin}
    return None


def _tools(store: Store, rid: int, customer: str, fold_unknown_tools: bool) -> list[dict[str, Any]]:
    """Per tool, keyed as `summary` keys them (by the recorded call's tool: `figures.tool_key`)."""
    rows = rq.tool_rows(store, rid, customer, fold_unknown_tools)
    for row in rows:
        rate = wilson(row["drifted_calls"], row["calls"])
        row.update(drift_rate=rate.p, ci_low=rate.low, ci_high=rate.high)
    return rows


def _arguments(store: Store, rid: int, customer: str, limit: int) -> list[dict[str, Any]]:
    rows = rq.argument_rows(store, rid, customer, limit)
    for row in rows:
        example = row.pop("example") or {}
        row["rate"] = row["calls_with_diff"] / row["tool_calls"] if row["tool_calls"] else None
        row["example_baseline"] = _clip(example.get("b"))
        row["example_candidate"] = _clip(example.get("c"))
    return rows


def _margins(store: Store, rid: int, customer: str, threshold: float) -> dict[str, Any]:
    values = rq.drifted_margins(store, rid, customer)
    known = [max(v, 0.0) for v in values if v is not None]
    bins = []
    for lo, hi in margin_bins(threshold):
        label = f"{lo:g}+" if hi == float("inf") else f"{lo:g}-{hi:g}"
        bins.append({"low": lo, "high": None if hi == float("inf") else hi, "label": label,
                     "count": sum(lo <= v < hi for v in known), "near_tie": hi <= threshold})
    return {"threshold": threshold, "drifted_calls": len(values), "with_evidence": len(known),
            "without_evidence": len(values) - len(known),
            "near_tie": sum(v < threshold for v in known), "large_margin": sum(v >= threshold for v in known),
            "histogram": bins}


def _examples(store: Store, rid: int, customer: str, options: ReportOptions) -> list[dict[str, Any]]:
    """The worst drifted calls: large margins first (possible bugs), then schema breaks, then the rest."""
    calls = rq.worst_calls(store, rid, customer, options.near_tie_margin, options.examples)
    if not calls:
        return []
    keys = [c["session_id"] for c in calls], [c["call_index"] for c in calls]
    diffs: dict[tuple, list] = {}
    for d in rq.example_diffs(store, rid, *keys):
        diffs.setdefault((d.pop("session_id"), d.pop("call_index")), []).append(
            {**d, "baseline": _clip(d["baseline"]), "candidate": _clip(d["candidate"])})
    outputs: dict[tuple, dict] = {}
    for o in rq.example_outputs(store, rid, *keys):
        outputs.setdefault((o["session_id"], o["call_index"]), {})[o["side"]] = _clip(o["shown"])
    for c in calls:
        key = (c["session_id"], c["call_index"])
        margin = c["baseline_margin"]
        c["attribution"] = ("no token evidence" if margin is None else
                            "near-tie" if margin < options.near_tie_margin else "possible decode-path bug")
        c["arg_diffs"] = diffs.get(key, [])
        c["baseline_output"] = outputs.get(key, {}).get("baseline")
        c["candidate_output"] = outputs.get(key, {}).get("candidate")
    return calls


def _clip(value: str | None, limit: int = VALUE_LIMIT) -> str | None:
    if value is None:
        return None
    return value if len(value) <= limit else value[: limit - 1] + "…"
