"""The `probes` table (migration 11): probe fingerprints of decode paths, stand-alone or recorded with a run."""

from __future__ import annotations

from typing import Any

from toolaudit.store.db import Store, _now

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


def latest_probe(store: Store, path_name: str) -> dict[str, Any] | None:
    """The newest stored probe of the path named `path_name` (stand-alone or a run's)."""
    rows = store.rows("SELECT * FROM probes WHERE path_name = ? ORDER BY probe_id DESC LIMIT 1", [path_name])
    return rows[0] if rows else None
