"""The SQL of `toolaudit merge`: copy shard runs from other DuckDB files into one new run, in one transaction.

Each source file is attached read-only; its run's rows are copied with the new run id (calls, outputs,
arg_diffs, trace_errors, replay_chunks renumbered after each other, staged_results), schema issues are kept
once, and `sessions` is re-materialised from the merged calls with the same SQL as `Store.finish_run`
(compounded_p uses run-wide per-tool rates, which only the merged calls give).
"""

from __future__ import annotations

import duckdb

from toolaudit import StoreError, __version__
from toolaudit.store.db import SESSIONS_SQL, Store
from toolaudit.store.rows import json_text

# Tables copied row for row (their key includes the run, so renumbering the run keeps them distinct).
_COPIED = ("calls", "outputs", "arg_diffs", "trace_errors", "staged_results")


def _quote(path: str) -> str:
    return "'" + path.replace("'", "''") + "'"


def source_runs(path: str) -> list[dict]:
    """Every run of a source file (opened read-only: its schema version is checked)."""
    with Store(path, read_only=True) as src:
        return src.rows("SELECT * FROM runs ORDER BY run_id")


def merged_before(store: Store, run: dict) -> int | None:
    """A run of `store` already merged from the same source runs (same options, `merged_from` included, and
    the same first start and last finish), or None."""
    rows = store.con.execute("SELECT run_id FROM runs WHERE options = ? AND created_at = ? AND finished_at = ? "
                             "AND status IN ('complete', 'partial') ORDER BY run_id LIMIT 1",
                             [json_text(run["options"]), run["created_at"], run["finished_at"]]).fetchall()
    return rows[0][0] if rows else None


def merge_into(store: Store, sources: list[tuple[str, int]], run: dict, counts: dict, status: str) -> int:
    """Copy each (file, run id) into one new run of `store` described by `run` (name, kind, names, sources,
    fingerprints, options, created_at, finished_at); returns the new run id. All or nothing."""
    con = store.con
    aliases = [f"_shard{i}" for i in range(len(sources))]
    for alias, (path, _) in zip(aliases, sources):
        con.execute(f"ATTACH {_quote(path)} AS {alias} (READ_ONLY)")
    try:
        with store.transaction():
            run_id = con.execute("SELECT nextval('run_id_seq')").fetchall()[0][0]
            con.execute(
                "INSERT INTO runs (run_id, name, kind, status, created_at, finished_at, baseline_name, "
                "candidate_name, baseline_source, candidate_source, baseline_fingerprint, candidate_fingerprint, "
                "options, counts, toolaudit_version) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [run_id, run["name"] or f"run-{run_id}", run["kind"], status, run["created_at"],
                 run["finished_at"], run["baseline_name"], run["candidate_name"], run["baseline_source"],
                 run["candidate_source"], run["baseline_fingerprint"], run["candidate_fingerprint"],
                 json_text(run["options"]), json_text(counts), __version__])
            for alias, (_, src_run) in zip(aliases, sources):
                for table in _COPIED:
                    _copy(con, alias, table, run_id, src_run)
            _copy_chunks(con, aliases, sources, run_id)
            union = " UNION ".join(
                f"SELECT tool_name, schema_source, severity, message FROM {a}.schema_issues WHERE run_id = {int(r)}"
                for a, (_, r) in zip(aliases, sources))
            con.execute(f"INSERT INTO schema_issues BY NAME SELECT {int(run_id)} AS run_id, * FROM ({union})")
            con.execute(SESSIONS_SQL, [run_id, run_id])
    finally:
        for alias in aliases:
            con.execute(f"DETACH {alias}")
    return run_id


def _copy(con: duckdb.DuckDBPyConnection, alias: str, table: str, run_id: int, src_run: int) -> None:
    try:
        con.execute(f"INSERT INTO {table} BY NAME SELECT * REPLACE (? AS run_id) FROM {alias}.{table} "
                    "WHERE run_id = ?", [run_id, src_run])
    except duckdb.ConstraintException as exc:
        raise StoreError(f"cannot merge: the runs overlap (a call is in two of them: {exc}); each shard may be "
                         "merged once") from None


def _copy_chunks(con: duckdb.DuckDBPyConnection, aliases: list[str], sources: list[tuple[str, int]],
                 run_id: int) -> None:
    """replay_chunks, numbered 0.. across the shards in the order given (a shard written before migration 8
    holds them as replay_batches, numbered by batch_no)."""
    offset = 0
    for alias, (_, src_run) in zip(aliases, sources):
        old = not con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = ? AND table_name = "
                              "'replay_chunks'", [alias]).fetchall()[0][0]
        table, number = ("replay_batches", "batch_no") if old else ("replay_chunks", "chunk_no")
        con.execute(f"INSERT INTO replay_chunks BY NAME SELECT * EXCLUDE ({number}) REPLACE (? AS run_id), "
                    f"{number} + ? AS chunk_no FROM {alias}.{table} WHERE run_id = ?", [run_id, offset, src_run])
        offset += con.execute(f"SELECT coalesce(max({number}) + 1, 0) FROM {alias}.{table} "
                              "WHERE run_id = ?", [src_run]).fetchall()[0][0]
