"""The queries of the canary's history (`toolaudit history`, `report --history`): the runs of a path pair over
time and the probes recorded with them. Run rows carry no call data; a customer's history reads only the runs
that hold that customer's calls (their figures come from `queries.slice_counts` and the other customer-filtered
queries)."""

from __future__ import annotations

from typing import Any

from toolaudit.store.db import Store
from toolaudit.store.queries import NONE_CUSTOMER

_RUN_COLUMNS = """run_id, name, kind, status, created_at, finished_at, matrix_id, baseline_name, candidate_name,
    baseline_fingerprint, candidate_fingerprint, options"""


def history_runs(store: Store, baseline: str | None = None, candidate: str | None = None,
                 customer: str | None = None) -> list[dict[str, Any]]:
    """Every run that holds calls (replay, compare, batch runs and the candidates of remedy matrices; not the
    `matrix` rows, which hold none), oldest first; with `baseline` and `candidate`, that path pair's only; with
    `customer`, only the runs that hold a call of that customer (`(none)`: calls without one)."""
    where, params = ["kind <> 'matrix'"], []
    if baseline is not None:
        where.append("baseline_name = ?")
        params.append(baseline)
    if candidate is not None:
        where.append("candidate_name = ?")
        params.append(candidate)
    if customer is not None:
        where.append(f"run_id IN (SELECT run_id FROM calls WHERE coalesce(customer, '{NONE_CUSTOMER}') = ?)")
        params.append(customer)
    return store.rows(f"SELECT {_RUN_COLUMNS} FROM runs WHERE {' AND '.join(where)} ORDER BY run_id", params)


def history_customers(store: Store, run_ids: list[int]) -> list[str]:
    """The customers with calls in any of these runs (`(none)` for calls without one), sorted."""
    rows = store.query(f"""SELECT DISTINCT coalesce(customer, '{NONE_CUSTOMER}') FROM calls
        WHERE run_id IN (SELECT unnest(?::BIGINT[])) ORDER BY 1""", [run_ids])[1]
    return [r[0] for r in rows]


def probes_for_runs(store: Store, run_ids: list[int]) -> list[dict[str, Any]]:
    """The probes recorded with these runs (a replay records one per path and side), oldest first: the
    behavioural fingerprint of each path's runtime (`decisions`, `numerics`) with its config fingerprint."""
    return store.rows("""SELECT probe_id, created_at, run_id, side, path_name, engine, config_fingerprint, probe_set,
            prompts, repeats, decisions, numerics, stable, jitter_max, jitter_median
        FROM probes WHERE run_id IN (SELECT unnest(?::BIGINT[])) ORDER BY probe_id""", [run_ids])
