"""The DuckDB store: migrations on open, bulk batch writes (one transaction each), run bookkeeping."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pyarrow as pa

from toolaudit import __version__
from toolaudit.errors import StoreError
from toolaudit.migrations import MIGRATIONS

DEFAULT_DB = "toolaudit.duckdb"

# Column order and Arrow types of the tables written in bulk.
TABLE_COLUMNS: dict[str, dict[str, pa.DataType]] = {
    "calls": {
        "run_id": pa.int64(), "session_id": pa.string(), "call_index": pa.int32(), "customer": pa.string(),
        "tool_name": pa.string(), "match_status": pa.string(), "drift_kind": pa.string(),
        "drifted": pa.bool_(), "exact_text_match": pa.bool_(), "baseline_valid": pa.bool_(),
        "candidate_valid": pa.bool_(), "arg_diff_count": pa.int32(), "detail": pa.string(),
        "first_divergence": pa.int32(), "baseline_token": pa.string(), "candidate_token": pa.string(),
        "baseline_margin": pa.float64(), "candidate_margin": pa.float64(),
    },
    "outputs": {
        "run_id": pa.int64(), "session_id": pa.string(), "call_index": pa.int32(), "side": pa.string(),
        "path_name": pa.string(), "source": pa.string(), "line": pa.int32(), "text": pa.string(),
        "tool_calls": pa.string(), "parse_status": pa.string(), "parse_format": pa.string(),
        "parse_error": pa.string(), "schema_errors": pa.string(), "system_fingerprint": pa.string(),
        "token_ids": pa.list_(pa.int32()), "prompt_tokens": pa.int32(), "completion_tokens": pa.int32(),
        "latency_s": pa.float64(), "ttft_s": pa.float64(), "tokens_per_s": pa.float64(),
        "drafted_tokens": pa.int32(), "accepted_tokens": pa.int32(), "forward_passes": pa.int32(),
        "error": pa.string(),
    },
    "arg_diffs": {
        "run_id": pa.int64(), "session_id": pa.string(), "call_index": pa.int32(), "call_position": pa.int32(),
        "tool_name": pa.string(), "arg_path": pa.string(), "diff_kind": pa.string(),
        "baseline_value": pa.string(), "candidate_value": pa.string(),
    },
    "trace_errors": {
        "run_id": pa.int64(), "side": pa.string(), "source": pa.string(), "line": pa.int32(),
        "field": pa.string(), "message": pa.string(), "excerpt": pa.string(),
    },
    "replay_batches": {
        "run_id": pa.int64(), "batch_no": pa.int32(), "side": pa.string(), "path_name": pa.string(),
        "calls": pa.int32(), "wall_s": pa.float64(), "completion_tokens": pa.int64(), "drafted_tokens": pa.int64(),
        "accepted_tokens": pa.int64(), "forward_passes": pa.int64(), "errors": pa.int32(),
    },
    "schema_issues": {
        "run_id": pa.int64(), "tool_name": pa.string(), "schema_source": pa.string(),
        "severity": pa.string(), "message": pa.string(),
    },
}


class RowBatch:
    """Rows for several tables, kept as tuples and turned into Arrow columns once, at write time.

    Tuples in column order are the cheapest thing to append per call; the transpose happens in bulk.
    """

    def __init__(self) -> None:
        self.rows: dict[str, list[tuple]] = {table: [] for table in TABLE_COLUMNS}
        self._order = {table: tuple(cols) for table, cols in TABLE_COLUMNS.items()}

    def add(self, table: str, **row: Any) -> None:
        self.rows[table].append(tuple(row.get(name) for name in self._order[table]))

    def add_tuple(self, table: str, row: tuple) -> None:
        """A row already in TABLE_COLUMNS order (hot paths)."""
        self.rows[table].append(row)

    def __len__(self) -> int:
        return len(self.rows["calls"]) + len(self.rows["trace_errors"])

    def tables(self) -> Iterable[tuple[str, pa.Table]]:
        for table, rows in self.rows.items():
            if rows:
                types = TABLE_COLUMNS[table]
                columns = list(zip(*rows))
                arrays = [pa.array(col, type=typ) for col, typ in zip(columns, types.values())]
                yield table, pa.Table.from_arrays(arrays, names=list(types))


def json_text(value: Any) -> str | None:
    """Encode a JSON value for a JSON column; values JSON cannot hold are kept as their repr."""
    if value is None:
        return None
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return orjson.dumps(repr(value)).decode()


_LOCK_PID = re.compile(r"PID (\d+)")


def _open_error(path: str, exc: Exception) -> StoreError:
    text = str(exc)
    if "lock" in text.lower():
        pid = _LOCK_PID.search(text)
        holder = f" (held by process {pid.group(1)})" if pid else ""
        return StoreError(f"{path}: database is locked by another writer{holder}; wait for it to finish "
                          f"or use another --db")
    if "not a valid DuckDB database" in text or "invalid" in text.lower():
        return StoreError(f"{path}: not a DuckDB database file; pass a new --db path or remove the file")
    return StoreError(f"{path}: cannot open database: {text}")


def _check_header(path: str) -> None:
    """Refuse files that are not DuckDB before DuckDB tries to interpret (or extend) them."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(16)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StoreError(f"{path}: cannot read database file: {exc.strerror or exc}") from None
    if head and head[8:12] != b"DUCK":
        raise StoreError(f"{path}: not a DuckDB database file; pass a new --db path or remove the file")


class Store:
    """One DuckDB file. Opening it for writing applies pending migrations."""

    def __init__(self, path: str | Path, read_only: bool = False):
        self.path = str(path)
        if read_only and not Path(self.path).exists():
            raise StoreError(f"{self.path}: no such database; run `toolaudit compare` or `replay` first")
        _check_header(self.path)
        try:
            # No extension auto-install: it would reach out to the network on some inputs.
            self.con = duckdb.connect(self.path, read_only=read_only, config={
                "autoinstall_known_extensions": False, "autoload_known_extensions": False})
        except duckdb.Error as exc:
            raise _open_error(self.path, exc) from None
        if not read_only:
            self.migrate()
        else:
            self._check_version()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.con.close()

    # -- schema -------------------------------------------------------------------------------------------
    def schema_version(self) -> int:
        exists = self.con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = 'schema_migrations'").fetchone()[0]
        if not exists:
            return 0
        return self.con.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()[0]

    def _check_version(self) -> None:
        latest = MIGRATIONS[-1][0]
        version = self.schema_version()
        if version > latest:
            raise StoreError(f"{self.path}: database schema version {version} is newer than this toolaudit "
                             f"({latest}); upgrade toolaudit")
        if version == 0:
            raise StoreError(f"{self.path}: not a toolaudit database (no schema_migrations table)")

    def migrate(self) -> None:
        self.con.execute("CREATE TABLE IF NOT EXISTS schema_migrations ("
                         "version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, applied_at TIMESTAMP NOT NULL)")
        current = self.schema_version()
        if current > MIGRATIONS[-1][0]:
            self._check_version()
        for version, name, sql in MIGRATIONS:
            if version <= current:
                continue
            self.con.execute("BEGIN TRANSACTION")
            try:
                self.con.execute(sql)
                self.con.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)", [version, name, _now()])
                self.con.execute("COMMIT")
            except Exception:
                self.con.execute("ROLLBACK")
                raise

    # -- runs -----------------------------------------------------------------------------------------------
    def create_run(self, kind: str, name: str | None, baseline_name: str, candidate_name: str,
                   baseline_source: str, candidate_source: str, options: dict,
                   baseline_fingerprint: str | None = None, candidate_fingerprint: str | None = None) -> int:
        run_id = self.con.execute("SELECT nextval('run_id_seq')").fetchone()[0]
        self.con.execute(
            "INSERT INTO runs (run_id, name, kind, status, created_at, baseline_name, candidate_name, "
            "baseline_source, candidate_source, baseline_fingerprint, candidate_fingerprint, options, "
            "toolaudit_version) VALUES (?, ?, ?, 'running', ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [run_id, name or f"run-{run_id}", kind, _now(), baseline_name, candidate_name, baseline_source,
             candidate_source, baseline_fingerprint, candidate_fingerprint, json_text(options), __version__])
        return run_id

    def write_batch(self, batch: RowBatch) -> None:
        """Insert every table of the batch in one transaction: a crash leaves all or none of it."""
        tables = list(batch.tables())
        if not tables:
            return
        self.con.execute("BEGIN TRANSACTION")
        try:
            for table, arrow in tables:
                self.con.register("_batch", arrow)
                self.con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _batch")
                self.con.unregister("_batch")
            self.con.execute("COMMIT")
        except Exception:
            self.con.execute("ROLLBACK")
            raise

    def finish_run(self, run_id: int, counts: dict, status: str = "complete") -> None:
        """Materialise the run's sessions and mark it finished, in one transaction."""
        self.con.execute("BEGIN TRANSACTION")
        try:
            self.con.execute("DELETE FROM sessions WHERE run_id = ?", [run_id])
            self.con.execute(SESSIONS_SQL, [run_id, run_id])
            self.con.execute("UPDATE runs SET status = ?, finished_at = ?, counts = ? WHERE run_id = ?",
                             [status, _now(), json_text(counts), run_id])
            self.con.execute("COMMIT")
        except Exception:
            self.con.execute("ROLLBACK")
            raise

    def set_status(self, run_id: int, status: str) -> None:
        self.con.execute("UPDATE runs SET status = ? WHERE run_id = ?", [status, run_id])

    def run_row(self, run_id: int | None) -> dict:
        """The given run, or the latest one."""
        if run_id is None:
            rows = self.rows("SELECT * FROM runs ORDER BY run_id DESC LIMIT 1")
            if not rows:
                raise StoreError(f"{self.path}: no runs yet; run `toolaudit compare` or `replay` first")
            return rows[0]
        rows = self.rows("SELECT * FROM runs WHERE run_id = ?", [run_id])
        if not rows:
            raise StoreError(f"{self.path}: no run with id {run_id} (see `toolaudit runs`)")
        return rows[0]

    # -- queries --------------------------------------------------------------------------------------------
    def query(self, sql: str, params: list | None = None) -> tuple[list[str], list[tuple]]:
        cur = self.con.execute(sql, params or [])
        columns = [d[0] for d in cur.description] if cur.description else []
        return columns, cur.fetchall() if cur.description else []

    def rows(self, sql: str, params: list | None = None) -> list[dict]:
        columns, rows = self.query(sql, params)
        return [dict(zip(columns, row)) for row in rows]


# Per session: observed drift, and the compounded probability from run-wide per-tool drift rates.
SESSIONS_SQL = """
INSERT INTO sessions
WITH tool_rates AS (
    SELECT tool_name, avg(drifted::DOUBLE) AS p FROM calls
    WHERE run_id = ? AND match_status = 'matched' GROUP BY tool_name)
SELECT c.run_id, c.session_id, any_value(c.customer) AS customer, count(*) AS calls,
       count(*) FILTER (c.match_status = 'matched') AS matched_calls,
       count(*) FILTER (c.drifted) AS drifted_calls,
       CASE WHEN count(*) FILTER (c.match_status = 'matched') > 0 THEN coalesce(bool_or(c.drifted), false) END
           AS any_drift,
       CASE WHEN count(*) FILTER (c.match_status = 'matched') > 0 THEN
           1 - coalesce(product(1 - coalesce(t.p, 0)) FILTER (c.match_status = 'matched'), 1) END AS compounded_p
FROM calls c LEFT JOIN tool_rates t ON t.tool_name IS NOT DISTINCT FROM c.tool_name
WHERE c.run_id = ?
GROUP BY c.run_id, c.session_id
"""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
