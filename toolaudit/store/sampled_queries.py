"""Named read queries of sampled runs (`samples`, `sampled_calls`, the `sampled_call_shifts` view): what
`analysis/sampled.py` turns into `summary`'s and `check`'s figures. Plain rows; the statistics are the caller's."""

from __future__ import annotations

from typing import Any

from toolaudit.store.db import Store

_CALL_COLUMNS = ("session_id, call_index, coalesce(customer, '(none)') AS customer, "
                 "coalesce(tool_name, '(none)') AS tool_name, n_baseline, n_candidate, outcomes, statistic, p_value, "
                 "tv, tv_low, tv_high")


def sampled_call_rows(store: Store, run_id: int) -> list[dict[str, Any]]:
    """Every `sampled_calls` row of a run (tested or not), by session and call index."""
    return store.rows(f"SELECT {_CALL_COLUMNS} FROM sampled_calls WHERE run_id = ? ORDER BY session_id, call_index",
                      [run_id])


def view_shifts(store: Store, run_id: int) -> list[dict[str, Any]]:
    """The `sampled_call_shifts` view's verdict per tested call: `q_value`, `shifted`."""
    return store.rows("""SELECT session_id, call_index, q_value, shifted FROM sampled_call_shifts
                         WHERE run_id = ? ORDER BY session_id, call_index""", [run_id])


def sample_rows(store: Store, run_id: int) -> list[tuple]:
    """Every sample of a run as (session_id, call_index, side, outcome, outcome_kind, tool_name, arguments), by
    call, side and sample index."""
    return store.query("""SELECT session_id, call_index, side, outcome, outcome_kind, tool_name, arguments::VARCHAR
                          FROM samples WHERE run_id = ? ORDER BY session_id, call_index, side, sample_index""",
                       [run_id])[1]


def sample_kind_counts(store: Store, run_id: int) -> dict[str, dict[str, int]]:
    """Samples per side and outcome kind (`tool_call`, `no_tool_call`, ..., `truncated`, `error`)."""
    out: dict[str, dict[str, int]] = {}
    for side, kind, n in store.query("""SELECT side, outcome_kind, count(*) FROM samples WHERE run_id = ?
                                        GROUP BY ALL ORDER BY side, outcome_kind""", [run_id])[1]:
        out.setdefault(side, {})[kind] = n
    return out


def shifted_calls_sql(run_id: int) -> str:
    """The query that lists a run's shifted calls, lowest p first (printed for `toolaudit sql`)."""
    return (f"SELECT session_id, call_index, customer, tool_name, p_value, q_value, tv, tv_low, tv_high "
            f"FROM sampled_call_shifts WHERE run_id = {int(run_id)} AND shifted ORDER BY p_value, session_id, "
            "call_index")
