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
        "customers": customers,
        "counts": orjson.loads(run["counts"]) if run["counts"] else None,
    }
