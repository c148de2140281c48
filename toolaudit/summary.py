"""The run summary: headline drift figures, per customer, as plain data for the CLI and reports."""

from __future__ import annotations

from typing import Any

import orjson

from toolaudit.stats import expected_session_drift, wilson
from toolaudit.store import Store


def run_summary(store: Store, run_id: int | None = None) -> dict[str, Any]:
    """Headline numbers of one run (the latest by default)."""
    run = store.run_row(run_id)
    rid = run["run_id"]
    head = store.rows("""
        SELECT count(*) AS calls, count(*) FILTER (drifted) AS drifted_calls,
               count(*) FILTER (exact_text_match) AS exact_text_matches
        FROM calls WHERE run_id = ? AND match_status = 'matched'""", [rid])[0]
    sessions = store.rows("""
        SELECT count(*) AS sessions, count(*) FILTER (any_drift) AS sessions_with_drift,
               avg(compounded_p) AS compounded_session_drift, avg(matched_calls) AS mean_calls_per_session
        FROM sessions WHERE run_id = ? AND matched_calls > 0""", [rid])[0]
    kinds = dict(store.query("""SELECT drift_kind, count(*) FROM calls
        WHERE run_id = ? AND match_status = 'matched' GROUP BY 1 ORDER BY 2 DESC""", [rid])[1])
    unmatched = dict(store.query("""SELECT match_status, count(*) FROM calls
        WHERE run_id = ? AND match_status <> 'matched' GROUP BY 1""", [rid])[1])
    errors = store.query("SELECT count(*) FROM trace_errors WHERE run_id = ?", [rid])[1][0][0]
    customers = store.rows("""SELECT customer, calls, drifted_calls, drift_rate, ci_low, ci_high, sessions,
        sessions_with_drift, observed_session_drift, compounded_session_drift
        FROM customer_drift WHERE run_id = ? ORDER BY customer""", [rid])
    paths = store.rows("""SELECT side, path_name, calls, wall_s, completion_tokens, tokens_per_s,
        drafted_tokens, accepted_tokens, acceptance_rate, tokens_per_forward_pass, errors
        FROM path_performance WHERE run_id = ? ORDER BY side""", [rid])
    by_side = {p["side"]: p for p in paths}
    speedup = None
    if by_side.get("baseline", {}).get("tokens_per_s") and by_side.get("candidate", {}).get("tokens_per_s"):
        speedup = by_side["candidate"]["tokens_per_s"] / by_side["baseline"]["tokens_per_s"]
    margins = store.rows("""SELECT count(*) FILTER (first_divergence IS NOT NULL) AS with_evidence,
        median(baseline_margin) AS median_margin FROM calls WHERE run_id = ? AND drifted""", [rid])[0]
    rate = wilson(head["drifted_calls"], head["calls"])
    n_sessions = sessions["sessions"] or 0
    return {
        "run_id": rid,
        "run_name": run["name"],
        "status": run["status"],
        "baseline": run["baseline_name"],
        "candidate": run["candidate_name"],
        "calls": head["calls"],
        "drifted_calls": head["drifted_calls"],
        "drift_rate": rate.p,
        "ci_low": rate.low,
        "ci_high": rate.high,
        "exact_text_matches": head["exact_text_matches"],
        "drift_kinds": kinds,
        "unmatched_calls": {"baseline_only": unmatched.get("baseline_only", 0),
                            "candidate_only": unmatched.get("candidate_only", 0)},
        "error_rows": errors,
        "sessions": n_sessions,
        "sessions_with_drift": sessions["sessions_with_drift"] or 0,
        "observed_session_drift": (sessions["sessions_with_drift"] or 0) / n_sessions if n_sessions else 0.0,
        "compounded_session_drift": sessions["compounded_session_drift"] or 0.0,
        "mean_calls_per_session": sessions["mean_calls_per_session"] or 0.0,
        "expected_session_drift": [{"calls": n, "p": p} for n, p in expected_session_drift(rate.p)],
        "paths": paths,
        "speedup": speedup,
        "drifted_with_token_evidence": margins["with_evidence"],
        "median_drift_margin": margins["median_margin"],
        "worst_example": worst_example(store, rid),
        "customers": customers,
        "counts": orjson.loads(run["counts"]) if run["counts"] else None,
    }


# Most severe first: a call that breaks its schema or calls another tool hurts more than a changed value.
_SEVERITY = ("schema_broken", "tool_name_changed", "call_count_changed", "unparseable", "arguments_changed")


def worst_example(store: Store, run_id: int) -> dict[str, Any] | None:
    """The most severe drifted call with both outputs and its argument diffs, or None."""
    order = " ".join(f"WHEN '{k}' THEN {i}" for i, k in enumerate(_SEVERITY))
    rows = store.rows(f"""SELECT session_id, call_index, customer, tool_name, drift_kind, detail,
        first_divergence, baseline_token, candidate_token, baseline_margin, candidate_margin
        FROM calls WHERE run_id = ? AND drifted
        ORDER BY CASE drift_kind {order} ELSE 9 END, baseline_margin DESC NULLS LAST, session_id, call_index
        LIMIT 1""", [run_id])
    if not rows:
        return None
    example = rows[0]
    key = [run_id, example["session_id"], example["call_index"]]
    outputs = {r["side"]: r["text"] for r in store.rows(
        "SELECT side, text FROM outputs WHERE run_id = ? AND session_id = ? AND call_index = ?", key)}
    example["baseline_text"], example["candidate_text"] = outputs.get("baseline"), outputs.get("candidate")
    example["arg_diffs"] = store.rows("""SELECT arg_path, diff_kind, baseline_value, candidate_value
        FROM arg_diffs WHERE run_id = ? AND session_id = ? AND call_index = ? ORDER BY arg_path""", key)
    return example
