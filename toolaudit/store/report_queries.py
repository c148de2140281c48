"""The queries of a customer's drift report (`report.data`): each one filtered to that customer's calls, or
reading run rows only, so a report never carries another customer's data (session ids, argument values,
counts, trace errors, schema issues).

Each returns plain rows; the report shapes them and computes the statistics.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from toolaudit.store.db import Store
from toolaudit.store.queries import NONE_CUSTOMER, tool_key_sql
from toolaudit.store.vocabulary import DRIFTED_KINDS, NO_TOOL_CALL, DriftKind, MatchStatus

# The per-tool rows' drift-kind columns, in DriftKind declaration order.
KIND_COLUMNS: tuple[str, ...] = tuple(str(k) for k in DRIFTED_KINDS)
MATCHED, ERROR = MatchStatus.MATCHED.value, MatchStatus.ERROR.value
SCHEMA_BROKEN = DriftKind.SCHEMA_BROKEN.value
# Every query over calls filters on this.
_CUSTOMER = f"coalesce(c.customer, '{NONE_CUSTOMER}') = ?"


class MatchedCounts(NamedTuple):
    calls: int
    drifted: int
    exact_text_matches: int
    top_drift_margin: float | None  # the largest baseline margin among the drifted calls


def customers(store: Store, rid: int) -> list[str]:
    rows = store.query(f"""SELECT DISTINCT coalesce(customer, '{NONE_CUSTOMER}') FROM calls c
        WHERE run_id = ? ORDER BY 1""", [rid])[1]
    return [r[0] for r in rows]


def path_rows(store: Store, rid: int, customer: str) -> list[dict[str, Any]]:
    """Per side, the path's name and the customer's failed calls (speeds: `analysis.speed`)."""
    return store.rows(f"""
        WITH o AS (
            SELECT o.*
            FROM outputs o JOIN calls c USING (run_id, session_id, call_index)
            WHERE o.run_id = ? AND c.match_status IN ('{MATCHED}', '{ERROR}') AND {_CUSTOMER})
        SELECT side, any_value(path_name) AS path_name, count(*) FILTER (error IS NOT NULL) AS errors
        FROM o GROUP BY side""", [rid, customer])


def other_runs(store: Store, rid: int) -> list[dict[str, Any]]:
    """Every other run, newest first (run rows only: no call data)."""
    return store.rows("""SELECT run_id, name, created_at, baseline_name, candidate_name, options FROM runs
                         WHERE run_id <> ? ORDER BY run_id DESC""", [rid])


def matched_counts(store: Store, rid: int, customer: str) -> MatchedCounts:
    """The customer's matched calls in a run (a noise-floor run, for the report's noise floor)."""
    return MatchedCounts(*store.query(f"""
        SELECT count(*), count(*) FILTER (drifted), count(*) FILTER (exact_text_match),
               max(baseline_margin) FILTER (drifted)
        FROM calls c WHERE run_id = ? AND match_status = '{MATCHED}' AND {_CUSTOMER}""",
                       [rid, customer])[1][0])


def tool_rows(store: Store, rid: int, customer: str, fold_unknown_tools: bool = False) -> list[dict[str, Any]]:
    """The customer's calls per tool, keyed as `summary` keys them (`queries.tool_key_sql`: the recorded call's
    tool; for rows without one, the baseline's, with `fold_unknown_tools` the names no schema knows as
    `(other)`). Which names a schema knows, and whether the run holds recorded tools, is read run-wide: only the
    customer's own calls are counted and named."""
    kinds = ", ".join(f"count(*) FILTER (drift_kind = '{k}') AS {k}" for k in KIND_COLUMNS)
    ctes, key, params = tool_key_sql(rid, fold_unknown_tools)
    return store.rows(f"""WITH {ctes}
        SELECT coalesce({key}, '{NO_TOOL_CALL}') AS tool_name, count(*) AS calls,
               count(*) FILTER (drifted) AS drifted_calls, {kinds}
        FROM calls c WHERE run_id = ? AND match_status = '{MATCHED}' AND {_CUSTOMER}
        GROUP BY 1 ORDER BY drifted_calls DESC, calls DESC, tool_name""", [*params, rid, customer])


def argument_rows(store: Store, rid: int, customer: str, limit: int) -> list[dict[str, Any]]:
    return store.rows(f"""
        WITH c AS (SELECT * FROM calls c WHERE run_id = ? AND match_status = '{MATCHED}' AND {_CUSTOMER}),
        per_tool AS (SELECT tool_name, count(*) AS tool_calls FROM c GROUP BY ALL)
        SELECT d.tool_name, d.arg_path, count(*) AS diffs,
               count(DISTINCT (d.session_id, d.call_index)) AS calls_with_diff, p.tool_calls,
               string_agg(DISTINCT d.diff_kind, ',' ORDER BY d.diff_kind) AS diff_kinds,
               first({{'b': d.baseline_value::VARCHAR, 'c': d.candidate_value::VARCHAR}}
                     ORDER BY d.session_id, d.call_index, d.call_position) AS example
        FROM arg_diffs d JOIN c ON c.run_id = d.run_id AND c.session_id = d.session_id
                                 AND c.call_index = d.call_index
        LEFT JOIN per_tool p ON p.tool_name IS NOT DISTINCT FROM d.tool_name
        GROUP BY d.tool_name, d.arg_path, p.tool_calls
        ORDER BY calls_with_diff DESC, d.tool_name, d.arg_path LIMIT ?""", [rid, customer, limit])


def drifted_margins(store: Store, rid: int, customer: str) -> list[float | None]:
    return [r[0] for r in store.query(f"""SELECT baseline_margin FROM calls c
        WHERE run_id = ? AND match_status = '{MATCHED}' AND drifted AND {_CUSTOMER}""", [rid, customer])[1]]


def worst_calls(store: Store, rid: int, customer: str, near_tie_margin: float,
                        limit: int) -> list[dict[str, Any]]:
    """The customer's worst drifted calls. `tool_name` is run A's tool; `tool_key` the one the per-tool tables put
    the call under (`tool_key_sql`: the recorded call's tool where the run has them), the name to show it by."""
    ctes, key, params = tool_key_sql(rid)
    return store.rows(f"""WITH {ctes}
        SELECT session_id, call_index, coalesce(tool_name, '{NO_TOOL_CALL}') AS tool_name,
               coalesce({key}, '{NO_TOOL_CALL}') AS tool_key, drift_kind, detail,
               first_divergence, baseline_token, candidate_token, baseline_margin, candidate_margin
        FROM calls c WHERE run_id = ? AND match_status = '{MATCHED}' AND drifted AND {_CUSTOMER}
        ORDER BY coalesce(baseline_margin >= ?, false) DESC, (drift_kind = '{SCHEMA_BROKEN}') DESC,
                 baseline_margin DESC NULLS LAST, arg_diff_count DESC, session_id, call_index
        LIMIT ?""", [*params, rid, customer, near_tie_margin, limit])


# The picked calls (already the customer's own), as parallel lists of session ids and call indexes.
_PICKED = ("JOIN (SELECT unnest(?::VARCHAR[]) AS session_id, unnest(?::INTEGER[]) AS call_index) k "
           "USING (session_id, call_index)")


def example_diffs(store: Store, rid: int, session_ids: list[str],
                          call_indexes: list[int]) -> list[dict[str, Any]]:
    return store.rows(f"""SELECT session_id, call_index, call_position, tool_name, arg_path, diff_kind,
                                 baseline_value::VARCHAR AS baseline, candidate_value::VARCHAR AS candidate
                          FROM arg_diffs {_PICKED} WHERE run_id = ?
                          ORDER BY call_position, arg_path""", [session_ids, call_indexes, rid])


def example_outputs(store: Store, rid: int, session_ids: list[str],
                            call_indexes: list[int]) -> list[dict[str, Any]]:
    return store.rows(f"""SELECT session_id, call_index, side, coalesce(tool_calls::VARCHAR, text) AS shown
                          FROM outputs {_PICKED} WHERE run_id = ?""", [session_ids, call_indexes, rid])
