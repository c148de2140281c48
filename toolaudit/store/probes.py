"""The `probes` table (migration 11): probe fingerprints of decode paths, stand-alone or recorded with a run.

A run's probe that could not be taken (an endpoint that failed or did not answer within the probe's deadline, a
path that failed to load) has no row here: it is recorded in the run's options, `probes_unavailable`, a list of
{side, path_name, reason} (`record_unavailable`, `unavailable_probes`), for `summary` and `history` to say
"probe unavailable: <reason>"."""

from __future__ import annotations

from typing import Any

import orjson

from toolaudit.store.db import Store, _now

UNAVAILABLE = "probes_unavailable"  # the key in a run's options

COLUMNS = ("run_id", "side", "path_name", "engine", "config_fingerprint", "probe_set", "prompts", "repeats",
           "decisions", "numerics", "stable", "jitter_max", "jitter_median", "seconds", "toolaudit_version",
           "engine_versions", "detail")


def insert_probe(store: Store, row: dict[str, Any]) -> int:
    """Store one probe (its own transaction); returns its probe_id."""
    with store.transaction() as con:
        probe_id = con.execute("SELECT nextval('probe_id_seq')").fetchall()[0][0]
        con.execute(f"INSERT INTO probes (probe_id, created_at, {', '.join(COLUMNS)}) "
                    f"VALUES (?, ?, {', '.join('?' * len(COLUMNS))})",
                    [probe_id, _now(), *(row[c] for c in COLUMNS)])
    return probe_id


def probe_by_id(store: Store, probe_id: int) -> dict[str, Any] | None:
    rows = store.rows("SELECT * FROM probes WHERE probe_id = ?", [probe_id])
    return rows[0] if rows else None


def probes_of_run(store: Store, run_id: int) -> list[dict[str, Any]]:
    """The probes a run recorded (and, for a matrix, its candidates' runs), baseline first."""
    return store.rows("SELECT * FROM probes WHERE run_id = ? OR run_id IN (SELECT run_id FROM runs WHERE "
                      "matrix_id = ?) ORDER BY side = 'baseline' DESC, probe_id", [run_id, run_id])


def probe_by_numerics(store: Store, prefix: str) -> dict[str, Any] | None:
    """The newest probe whose numerics (or, for a tokens-only probe, decisions) hash starts with `prefix`."""
    rows = store.rows("SELECT * FROM probes WHERE starts_with(numerics, ?) OR (numerics IS NULL AND "
                      "starts_with(decisions, ?)) ORDER BY probe_id DESC LIMIT 1", [prefix, prefix])
    return rows[0] if rows else None


def latest_probe(store: Store, path_name: str, probe_set: str | None = None) -> dict[str, Any] | None:
    """The newest stored probe of the path named `path_name` (stand-alone or a run's); with `probe_set` (a
    digest), the newest that decoded that set (a run's smaller probe is not compared with a whole set's)."""
    if probe_set is None:
        rows = store.rows("SELECT * FROM probes WHERE path_name = ? ORDER BY probe_id DESC LIMIT 1", [path_name])
    else:
        rows = store.rows("SELECT * FROM probes WHERE path_name = ? AND probe_set = ? ORDER BY probe_id DESC "
                          "LIMIT 1", [path_name, probe_set])
    return rows[0] if rows else None


def record_unavailable(store: Store, run_id: int, entries: list[dict[str, Any]]) -> None:
    """Record the run's probes that could not be taken: {side, path_name, reason} each."""
    store.update_options(run_id, {UNAVAILABLE: entries})


def unavailable_probes(store: Store, run_id: int) -> list[dict[str, Any]]:
    """The probes a run (and, for a matrix, its candidates' runs) could not take: {run_id, side, path_name,
    reason}, baseline first."""
    out = []
    for row in store.rows("SELECT run_id, options FROM runs WHERE run_id = ? OR matrix_id = ? ORDER BY run_id",
                          [run_id, run_id]):
        options = orjson.loads(row["options"]) if row["options"] else {}
        out += [{"run_id": row["run_id"], **entry} for entry in options.get(UNAVAILABLE) or []]
    return sorted(out, key=lambda e: e.get("side") != "baseline")


def run_unavailable_probes(store: Store, run: dict[str, Any]) -> list[dict[str, Any]]:
    """The probes a run could not take, as its summary and history say them: a matrix's every member's; a
    member's or a plain run's own, the baseline's included (recorded with the matrix run, which probes it once)."""
    if run["kind"] == "matrix" or run.get("matrix_id") is None:
        return unavailable_probes(store, run["run_id"])
    mine = {("baseline", run["baseline_name"]), ("candidate", run["candidate_name"])}
    return [e for e in unavailable_probes(store, run["matrix_id"]) if (e["side"], e["path_name"]) in mine]

