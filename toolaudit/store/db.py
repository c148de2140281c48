"""The DuckDB store: migrations on open, bulk row writes, run bookkeeping and replay bookkeeping. The `Store`
owns every transaction (each rolls back on failure); the SQL of the other store modules runs through it."""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
import orjson
import pyarrow as pa

from toolaudit import RunNotFound, StoreError, __version__
from toolaudit.store.files import DatabaseLocked, check_folder, check_header, open_error, writer_locked
from toolaudit.store.migrations import MIGRATIONS, SCHEMA_MIGRATIONS_TABLE, create_schema
from toolaudit.store.recovery import LIVE, live_key, settle_dead_runs
from toolaudit.store.rows import RowBuffer, json_text
from toolaudit.store.snapshot import SnapshotNote, SnapshotPublisher, open_snapshot
from toolaudit.store.template import place_new_file
from toolaudit.store.vocabulary import MatchStatus


class Store:
    """One DuckDB file. Opening it applies pending migrations: a read-only open of a file an older toolaudit
    wrote first upgrades it (briefly writable, as any writer would), so the views and names the read-only
    commands query exist; when that is not possible (another process holds the file), it opens as it is.

    A read-only open of a file that a replay or compare is writing opens that writer's snapshot instead
    (`snapshot.py`); `snapshot` then says how current it is. Writer against writer stays an error, told as a
    writer needs it (wait, or another --db).

    A writer that created the file and fails before its first run row (a missing trace file, a bad
    paths.toml, Ctrl-C) removes it again: a failed command leaves no empty database behind."""

    def __init__(self, path: str | Path, read_only: bool = False):
        self.path = str(path)
        self.snapshot: SnapshotNote | None = None  # set when reading the writer's snapshot
        self.active_run: int | None = None  # the run this writer is writing (named in its snapshots)
        self.after_commit: Callable[[], None] | None = None  # e.g. a throttled snapshot
        self._publisher: SnapshotPublisher | None = None
        self._writing: set[int] = set()  # runs this store made or resumed and has not finished
        self._in_transaction = False
        self._unannounced = False  # a run row readers' snapshot does not hold yet (see `_announce_run`)
        check_folder(self.path)
        if read_only and not Path(self.path).exists():
            raise RunNotFound(f"{self.path}: no such database; run `toolaudit compare` or `replay` first")
        check_header(self.path)
        self._created = not read_only and not Path(self.path).exists()  # removed again if nothing is written
        placed = self._created and place_new_file(self.path)
        try:
            self.con = self._connect(read_only)
        except DatabaseLocked as locked:
            if not read_only:
                raise writer_locked(self.path, locked.pid, self._connect_snapshot) from None
            found = open_snapshot(self.path, locked.pid, self._connect_snapshot)
            if found is None:
                raise DatabaseLocked(f"{self.path}: database is locked by another writer"
                                     f"{f' (held by process {locked.pid})' if locked.pid else ''} and no "
                                     f"snapshot of it for readers is published yet (a replay or compare "
                                     f"publishes one soon after it starts); try again shortly or wait for it "
                                     f"to finish", locked.pid) from None
            self.con, self.snapshot = found
            return
        if not read_only:
            try:
                if placed:  # the template's schema, applied now
                    self.con.execute("UPDATE schema_migrations SET applied_at = ?", [_now()])
                self.migrate()
                settle_dead_runs(self.con, self.path)
            except BaseException:
                self.close(failed=True)
                raise
        elif 0 < self._check_version() < MIGRATIONS[-1][0]:
            self._upgrade()

    def _connect(self, read_only: bool) -> duckdb.DuckDBPyConnection:
        try:
            # No extension auto-install: it would reach out to the network on some inputs.
            return duckdb.connect(self.path, read_only=read_only, config={
                "autoinstall_known_extensions": False, "autoload_known_extensions": False})
        except duckdb.Error as exc:
            raise open_error(self.path, exc) from None

    @staticmethod
    def _connect_snapshot(path: str) -> duckdb.DuckDBPyConnection:
        return duckdb.connect(path, read_only=True, config={
            "autoinstall_known_extensions": False, "autoload_known_extensions": False})

    def publish_snapshots(self, command: str, on_commit: bool = False, **throttle) -> SnapshotPublisher:
        """Let readers follow this writer (`snapshot.py`): snapshots as `update()` (or, with `on_commit`, each
        commit) and the throttle allow, the first at once for a small database; removed when this store closes."""
        self._publisher = SnapshotPublisher(self, command, **throttle)
        self._publisher.update()
        if on_commit:
            self.after_commit = self._publisher.update
        return self._publisher

    def _upgrade(self) -> None:
        """Migrate an older file that was opened read-only, then reopen it read-only."""
        self.con.close()
        try:
            self.con = self._connect(False)
        except StoreError:  # held by a writer (which migrated it) or not writable: read it as it is
            self.con = self._connect(True)
            return
        try:
            self.migrate()
        finally:
            self.con.close()
        self.con = self._connect(True)

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, exc_type: type | None, *exc: object) -> None:
        self.close(failed=exc_type is not None)

    def close(self, failed: bool = False) -> None:
        """Close the file. After a failure, the runs this store left `running` are marked `interrupted` (whatever
        the failure interrupted), and a file this store created that holds no run is removed."""
        if failed and self._writing:
            with contextlib.suppress(duckdb.Error):
                self.mark_interrupted(list(self._writing))
        empty = failed and self._created and self._holds_no_run()
        self.con.close()
        if self._publisher is not None:  # after the main file is free: a reader then opens that
            self._publisher.remove()
            self._publisher = None
        if empty:
            for leftover in (self.path, f"{self.path}.wal"):
                with contextlib.suppress(FileNotFoundError):
                    Path(leftover).unlink()

    def _holds_no_run(self) -> bool:
        """True only when the file surely holds no run (an unreadable state keeps the file)."""
        try:
            return self.con.execute("SELECT count(*) FROM runs").fetchall()[0][0] == 0
        except duckdb.CatalogException:  # stopped before the migration that makes `runs`
            return True
        except duckdb.Error:
            return False

    # -- schema -------------------------------------------------------------------------------------------
    def schema_version(self) -> int:
        exists = self.con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = 'schema_migrations'").fetchall()[0][0]
        if not exists:
            return 0
        return self.con.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchall()[0][0]

    def _check_version(self) -> int:
        latest = MIGRATIONS[-1][0]
        version = self.schema_version()
        if version > latest:
            raise StoreError(f"{self.path}: database schema version {version} is newer than this toolaudit "
                             f"({latest}); upgrade toolaudit")
        if version == 0:
            raise StoreError(f"{self.path}: not a toolaudit database (no schema_migrations table)")
        return version

    def migrate(self) -> None:
        self.con.execute(SCHEMA_MIGRATIONS_TABLE)
        current = self.schema_version()
        if current > MIGRATIONS[-1][0]:
            self._check_version()
        if current == 0:
            self._create_schema()
            return
        for version, name, sql in MIGRATIONS:
            if version <= current:
                continue
            with self.transaction():
                self.con.execute(sql)
                self.con.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)", [version, name, _now()])

    def _create_schema(self) -> None:
        with self.transaction():
            create_schema(self.con, _now())

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """All statements inside commit together or not at all (rolled back on any exception, Ctrl-C included)."""
        self.con.execute("BEGIN TRANSACTION")
        self._in_transaction = True
        try:
            yield self.con
            self.con.execute("COMMIT")  # inside: a signal that lands just before it still rolls back
        except BaseException:
            self._unannounced = False  # a run row made inside is rolled back with it
            with contextlib.suppress(duckdb.Error):  # a COMMIT that failed has ended the transaction itself
                self.con.execute("ROLLBACK")
            raise
        finally:
            self._in_transaction = False
        self._announce_run()
        if self.after_commit is not None:
            self.after_commit()

    def _announce_run(self) -> None:
        """A new run's row, committed: published to readers now rather than with its first chunk, which may be
        minutes away (models load, paths are probed first); until then `summary` could only say "no runs yet"."""
        if self._unannounced and not self._in_transaction:
            self._unannounced = False
            if self._publisher is not None:
                self._publisher.run_started()

    # -- runs -----------------------------------------------------------------------------------------------
    def create_run(self, kind: str, name: str | None, baseline_name: str, candidate_name: str,
                   baseline_source: str, candidate_source: str, options: dict,
                   baseline_fingerprint: str | None = None, candidate_fingerprint: str | None = None,
                   matrix_id: int | None = None) -> int:
        """A new run row (`matrix_id`: the matrix run this run is one candidate of)."""
        run_id = self.con.execute("SELECT nextval('run_id_seq')").fetchall()[0][0]
        if matrix_id is None:
            self.active_run = run_id
        LIVE.add(live_key(self.path, run_id))  # see recovery.py: not a dead writer's run
        self._writing.add(run_id)
        if matrix_id is not None and name is None:  # candidates are told apart by name inside a matrix
            name = f"run-{matrix_id}/{candidate_name}"
        self.con.execute(
            "INSERT INTO runs (run_id, name, kind, status, created_at, baseline_name, candidate_name, "
            "baseline_source, candidate_source, baseline_fingerprint, candidate_fingerprint, options, "
            "toolaudit_version, matrix_id) VALUES (?, ?, ?, 'running', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [run_id, name or f"run-{run_id}", kind, _now(), baseline_name, candidate_name, baseline_source,
             candidate_source, baseline_fingerprint, candidate_fingerprint, json_text(options), __version__,
             matrix_id])
        if matrix_id is None:  # the run readers are told is being written (a matrix's, not each member's)
            self._unannounced = True
            self._announce_run()  # at once, or when the transaction it was made in commits
        return run_id

    def write_rows(self, rows: RowBuffer) -> None:
        """Insert every table of the buffer in one transaction: a crash leaves all or none of it."""
        tables = list(rows.tables())
        if not tables:
            return
        with self.transaction() as con:
            insert_tables(con, tables)

    def finish_run(self, run_id: int, counts: dict, status: str = "complete") -> None:
        """Materialise the run's sessions and mark it finished, in one transaction."""
        with self.transaction() as con:
            con.execute("DELETE FROM sessions WHERE run_id = ?", [run_id])
            con.execute(SESSIONS_SQL, [run_id, run_id])
            con.execute("UPDATE runs SET status = ?, finished_at = ?, counts = ? WHERE run_id = ?",
                        [status, _now(), json_text(counts), run_id])
        LIVE.discard(live_key(self.path, run_id))
        self._writing.discard(run_id)

    def set_status(self, run_id: int, status: str) -> None:
        self.con.execute("UPDATE runs SET status = ? WHERE run_id = ?", [status, run_id])
        if status == "running":  # a resumed run is this process's again
            LIVE.add(live_key(self.path, run_id))
            self._writing.add(run_id)
        else:
            LIVE.discard(live_key(self.path, run_id))
            self._writing.discard(run_id)

    def mark_interrupted(self, run_ids: Iterable[int]) -> None:
        """Runs stopped by an error, Ctrl-C or SIGTERM: `running` becomes `interrupted` (`replay --resume`, or
        the same compare again, finishes them). A run that already completed stays `complete`: the stop may come
        after its last commit."""
        ids = list(run_ids)
        if not ids:
            return
        # a batch run is `running` while it waits for its other side: that is no interruption (recovery.py)
        self.con.execute(f"UPDATE runs SET status = 'interrupted' WHERE status = 'running' AND kind <> 'batch' "
                         f"AND run_id IN ({', '.join('?' * len(ids))})", ids)
        for run_id in ids:
            LIVE.discard(live_key(self.path, run_id))
            self._writing.discard(run_id)

    def discard_run(self, run_id: int) -> None:
        """Delete a run and every row it wrote, in one transaction: for a command that failed before it measured
        anything (a compare whose log held no usable call), which leaves nothing, as a failure before writing
        does, instead of an `interrupted` run of 0 calls that `summary` would show as a result."""
        tables = [t for (t,) in self.con.execute(
            "SELECT DISTINCT c.table_name FROM information_schema.columns c JOIN information_schema.tables t "
            "USING (table_schema, table_name) WHERE c.column_name = 'run_id' AND t.table_type = 'BASE TABLE' "
            "AND c.table_schema = current_schema() AND c.table_name <> 'runs'").fetchall()]
        with self.transaction() as con:
            for table in sorted(tables):
                con.execute(f'DELETE FROM "{table}" WHERE run_id = ?', [run_id])
            con.execute("DELETE FROM runs WHERE run_id = ?", [run_id])
        LIVE.discard(live_key(self.path, run_id))
        self._writing.discard(run_id)
        if self.active_run == run_id:
            self.active_run = None

    def confine(self) -> None:
        """No file, network or extension access for the rest of this connection, and no setting can change
        again (so a query cannot turn access back on): for SQL a user passes through (`toolaudit sql`)."""
        self.con.execute("SET enable_external_access = false")
        self.con.execute("SET lock_configuration = true")

    def run_row(self, run_id: int | None) -> dict:
        """The given run, or the latest one (a matrix rather than its last candidate)."""
        if run_id is None:
            rows = self.rows("SELECT * FROM runs WHERE matrix_id IS NULL ORDER BY run_id DESC LIMIT 1")
            if not rows:
                raise RunNotFound(f"{self.path}: no runs yet; run `toolaudit compare` or `replay` first")
            return rows[0]
        rows = self.rows("SELECT * FROM runs WHERE run_id = ?", [run_id])
        if not rows:
            raise RunNotFound(f"{self.path}: no run with id {run_id} (see `toolaudit runs`)")
        return rows[0]

    def update_options(self, run_id: int, values: dict) -> None:
        """Add (or replace) keys of a run's options JSON."""
        raw = self.con.execute("SELECT options FROM runs WHERE run_id = ?", [run_id]).fetchall()
        options = orjson.loads(raw[0][0]) if raw and raw[0][0] else {}
        self.con.execute("UPDATE runs SET options = ? WHERE run_id = ?", [json_text({**options, **values}), run_id])

    def join_matrix(self, run_id: int, matrix_id: int) -> None:
        """Attach a finished run to a matrix run as one of its candidates."""
        self.con.execute("UPDATE runs SET matrix_id = ? WHERE run_id = ?", [matrix_id, run_id])

    def matrix_members(self, matrix_id: int) -> list[dict]:
        """The candidate runs of a matrix run, in the order the candidates were given."""
        return self.rows("SELECT * FROM runs WHERE matrix_id = ? ORDER BY run_id", [matrix_id])

    # -- replay bookkeeping ------------------------------------------------------------------------------------
    def replace_trace_errors(self, run_id: int, rows: RowBuffer) -> None:
        """Idempotent: a resumed run rewrites its input error rows instead of adding copies."""
        with self.transaction() as con:
            con.execute("DELETE FROM trace_errors WHERE run_id = ?", [run_id])
            insert_tables(con, rows.tables())

    def stored_call_keys(self, run_id: int, retry_errors: bool = True) -> set[tuple[str, int]]:
        """(session, call index) of the calls a run already holds; error rows are first removed to be retried."""
        if retry_errors:
            error = MatchStatus.ERROR.value
            with self.transaction() as con:
                for table in ("outputs", "samples", "sampled_calls"):
                    con.execute(f"DELETE FROM {table} WHERE run_id = ? AND (session_id, call_index) IN "
                                "(SELECT session_id, call_index FROM calls WHERE run_id = ? AND match_status = ?)",
                                [run_id, run_id, error])
                con.execute("DELETE FROM calls WHERE run_id = ? AND match_status = ?", [run_id, error])
        rows = self.con.execute("SELECT session_id, call_index FROM calls WHERE run_id = ?", [run_id]).fetchall()
        return {(s, i) for s, i in rows}

    def next_chunk_no(self, run_id: int) -> int:
        """The number of a run's next `replay_chunks` row (a resumed run continues the numbering)."""
        return self.con.execute("SELECT coalesce(max(chunk_no) + 1, 0) FROM replay_chunks WHERE run_id = ?",
                                [run_id]).fetchall()[0][0]

    def staged_keys(self, run_id: int, side: str) -> set[tuple[str, int]]:
        """Calls whose `side` result is staged (path-major replay: that path already ran them)."""
        rows = self.con.execute("SELECT session_id, call_index FROM staged_results WHERE run_id = ? AND side = ?",
                                [run_id, side]).fetchall()
        return {(s, i) for s, i in rows}

    def staged_results(self, run_id: int, side: str, keys: list[tuple[str, int]]) -> dict[tuple[str, int], dict]:
        """(session, call index) -> {path_name, wall_share_s, result (JSON text)} for the given calls."""
        if not keys:
            return {}
        wanted = pa.table({"session_id": [k[0] for k in keys], "call_index": pa.array([k[1] for k in keys],
                                                                                      pa.int32())})
        self.con.register("_wanted", wanted)
        try:
            rows = self.con.execute("""SELECT s.session_id, s.call_index, s.path_name, s.wall_share_s, s.result
                FROM staged_results s JOIN _wanted w USING (session_id, call_index)
                WHERE s.run_id = ? AND s.side = ?""", [run_id, side]).fetchall()
        finally:
            self.con.unregister("_wanted")
        return {(r[0], r[1]): {"path_name": r[2], "wall_share_s": r[3], "result": r[4]} for r in rows}

    def drop_staged(self, run_id: int, failed_only: bool = False) -> None:
        """Drop a run's staged results (all, or only those whose engine failed, so a resume retries them)."""
        failed = " AND json_extract_string(result, '$.error') IS NOT NULL" if failed_only else ""
        self.con.execute(f"DELETE FROM staged_results WHERE run_id = ?{failed}", [run_id])

    def write_rows_unstaging(self, rows: RowBuffer, run_id: int, keys: list[tuple[str, int]]) -> None:
        """Write the rows and drop the staged results they consumed, in one transaction (a kill keeps both or
        neither, so a resume neither loses nor repeats a call)."""
        with self.transaction() as con:
            insert_tables(con, rows.tables())
            if keys:
                con.register("_done", pa.table({"session_id": [k[0] for k in keys],
                                                 "call_index": pa.array([k[1] for k in keys], pa.int32())}))
                con.execute("DELETE FROM staged_results WHERE run_id = ? AND (session_id, call_index) IN "
                            "(SELECT session_id, call_index FROM _done)", [run_id])
                con.unregister("_done")

    # -- queries --------------------------------------------------------------------------------------------
    def query(self, sql: str, params: list | None = None) -> tuple[list[str], list[tuple]]:
        cur = self.con.execute(sql, params or [])
        columns = [d[0] for d in cur.description] if cur.description else []
        return columns, cur.fetchall() if cur.description else []

    def rows(self, sql: str, params: list | None = None) -> list[dict]:
        columns, rows = self.query(sql, params)
        return [dict(zip(columns, row)) for row in rows]


# Per session: observed drift, and the compounded probability from run-wide per-tool drift rates. Floating
# aggregates take their inputs in a fixed order (call index), so the result does not depend on the physical
# row order: a run merged from shards gives the same bits as the unsharded run.
_M = f"match_status = '{MatchStatus.MATCHED.value}'"
SESSIONS_SQL = f"""
INSERT INTO sessions
WITH tool_rates AS (
    SELECT tool_name, avg(drifted::DOUBLE) AS p FROM calls
    WHERE run_id = ? AND {_M} GROUP BY tool_name)
SELECT c.run_id, c.session_id, arg_min(c.customer, c.call_index) FILTER (c.customer IS NOT NULL) AS customer,
       count(*) AS calls,
       count(*) FILTER (c.{_M}) AS matched_calls,
       count(*) FILTER (c.drifted) AS drifted_calls,
       CASE WHEN count(*) FILTER (c.{_M}) > 0 THEN coalesce(bool_or(c.drifted), false) END
           AS any_drift,
       CASE WHEN count(*) FILTER (c.{_M}) > 0 THEN
           1 - coalesce(product(1 - coalesce(t.p, 0) ORDER BY c.call_index) FILTER (c.{_M}), 1) END
           AS compounded_p
FROM calls c LEFT JOIN tool_rates t ON t.tool_name IS NOT DISTINCT FROM c.tool_name
WHERE c.run_id = ?
GROUP BY c.run_id, c.session_id
"""


def insert_tables(con: duckdb.DuckDBPyConnection, tables: Iterable[tuple[str, pa.Table]]) -> None:
    """Append Arrow tables to the store's tables by column name (inside the caller's transaction)."""
    for table, arrow in tables:
        con.register("_rows", arrow)
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _rows")
        con.unregister("_rows")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
