"""Readers during a run. DuckDB lets one process hold a file read-write and no other process open it meanwhile,
so a replay or compare publishes a read-only copy beside the database, `<db>.snapshot`, which `summary`,
`report`, `check`, `sql`, `runs`, `frontier` and `export` open when the main file is locked.

Writer: `SnapshotPublisher` copies the database on the writer's own connection between transactions (so the
copy holds committed chunks only) into a temporary file, then `os.replace`s it over the snapshot: a reader sees
the previous snapshot or the next, never a half-written one. Throttled so copying costs at most `max_share` of
the run's time so far (the next copy's cost estimated from the file size and the last copy's speed, plus a
small allowance so a small database is published at once), and copies are at least `min_interval_s` apart.
A 100,000-call database (61 MB) copies in about 1 s on 2 cores: one snapshot per ~20 s of run. A new run's row
is published once committed, the throttle aside (`run_started`: one copy per run): models load and paths are
probed before the first chunk, and until then readers would find no run. The snapshot is removed once the
writer has closed the main file.

Reader: the snapshot's note (table `toolaudit_snapshot`) says which process wrote it, when, and how far the run
was. It is used only while that process holds the main file: after a kill -9 the main file opens again and the
leftover snapshot is never read (the next writer replaces it)."""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import duckdb

NOTE_TABLE = "toolaudit_snapshot"
_ATTACHED = "_ta_snapshot"
FIRST_BYTES_PER_S = 50e6  # copy speed assumed before the first copy (measured: ~60 MB/s on 2 cores)
# Copy time allowed beyond the share, so that a small database is published from the start. It must hold the copies
# made so far plus the next one's estimate: a 12 KB file copies in ~12 ms on an idle 2-core machine and 25-40 ms
# with both cores busy, and at 0.1 s a test's early snapshot was refused under a three-worker suite; 0.5 s holds
# a dozen such copies.
ALLOWANCE_S = 0.5


def snapshot_path(db: str | Path) -> Path:
    return Path(f"{db}.snapshot")


@dataclass(frozen=True)
class SnapshotNote:
    """What a snapshot says of itself: the writer's process, when it was taken, the run and its progress."""

    pid: int
    taken_at: dt.datetime  # UTC
    command: str  # replay, compare
    run_id: int | None
    done: int | None  # calls done when it was taken (the progress bar's count)
    total: int | None

    def line(self, db: str) -> str:
        run = f" run {self.run_id}" if self.run_id is not None else ""
        progress = ""
        if self.done is not None:
            progress = f", {self.done} of {self.total} calls" if self.total is not None else f", {self.done} calls"
        return (f"{db}: being written by process {self.pid} ({self.command}{run}): figures as of "
                f"{self.taken_at:%H:%M:%S} UTC{progress}")


class SnapshotPublisher:
    """Publishes snapshots of a writer's `Store` (see the module docstring); `Store.close` removes the last."""

    def __init__(self, store, command: str, min_interval_s: float = 2.0, max_share: float = 0.05,
                 on_error: Callable[[str], None] | None = None):
        self.store, self.command = store, command
        self.min_interval_s, self.max_share, self.on_error = min_interval_s, max_share, on_error
        self.path = snapshot_path(store.path)
        self.tmp = Path(f"{self.path}.tmp-{os.getpid()}")
        self.done: int | None = None
        self.total: int | None = None
        self.started = time.monotonic()
        self.last = float("-inf")  # when the last copy ended
        self.copy_s = 0.0  # time spent copying, all snapshots together
        self.bytes_per_s = FIRST_BYTES_PER_S
        self.failed: str | None = None
        self.remove()  # a snapshot left by a killed writer: this process holds the file now

    def update(self, done: int | None = None, total: int | None = None) -> None:
        """Record progress; publish when the throttle allows."""
        if done is not None:
            self.done = done
        if total is not None:
            self.total = total
        if self.due():
            self.publish()

    def run_started(self) -> None:
        """A new run's row is committed: publish now, throttle aside (one copy per run), so that readers learn
        which run is being written before its first chunk is stored. Not left to the share: that compares
        measured copy times with the run's age, so on a loaded machine a run could start unannounced."""
        self.publish()

    def due(self) -> bool:
        now = time.monotonic()
        if now - self.last < self.min_interval_s:
            return False
        try:
            estimate = os.path.getsize(self.store.path) / self.bytes_per_s
        except OSError:
            estimate = 0.0
        return self.copy_s + estimate <= self.max_share * (now - self.started) + ALLOWANCE_S

    def publish(self) -> None:
        """Copy the committed database to the snapshot now. A failure disables publishing, never the run."""
        if self.failed is not None:
            return
        started = time.monotonic()
        con = self.store.con
        try:
            self._unlink(self.tmp)
            name = con.execute("SELECT current_database()").fetchall()[0][0]
            con.execute(f"ATTACH '{_quoted(self.tmp)}' AS {_ATTACHED}")
            try:
                con.execute(f'COPY FROM DATABASE "{name}" TO {_ATTACHED}')
                con.execute(f"CREATE TABLE {_ATTACHED}.{NOTE_TABLE} AS SELECT ?::BIGINT AS pid, ?::TIMESTAMP AS "
                            "taken_at, ?::VARCHAR AS command, ?::BIGINT AS run_id, ?::BIGINT AS done, "
                            "?::BIGINT AS total",
                            [os.getpid(), _utcnow(), self.command, self.store.active_run, self.done, self.total])
            finally:
                con.execute(f"DETACH {_ATTACHED}")
            os.replace(self.tmp, self.path)
        except (duckdb.Error, OSError) as exc:
            self.failed = str(exc)
            self._unlink(self.tmp)
            if self.on_error:
                self.on_error(f"readers cannot follow this run: snapshot {self.path} not written: {exc}")
            return
        self.last = time.monotonic()
        took = self.last - started
        self.copy_s += took
        try:
            self.bytes_per_s = max(os.path.getsize(self.store.path) / max(took, 1e-3), 1e6)
        except OSError:
            pass

    def remove(self) -> None:
        for path in (self.path, self.tmp):
            self._unlink(path)

    @staticmethod
    def _unlink(path: Path) -> None:
        for p in (path, Path(f"{path}.wal")):
            try:
                p.unlink()
            except FileNotFoundError:
                pass


def open_snapshot(db: str, holder_pid: int | None, connect: Callable[[str], duckdb.DuckDBPyConnection]
                  ) -> tuple[duckdb.DuckDBPyConnection, SnapshotNote] | None:
    """The snapshot of `db` and its note, when the process that wrote it is the one holding `db` (`holder_pid`,
    or, when the lock error did not say, a process still alive); else None."""
    path = snapshot_path(db)
    if not path.exists():
        return None
    try:
        con = connect(str(path))
    except Exception:  # noqa: BLE001 - unreadable or vanished: as if there were none
        return None
    try:
        row = con.execute(f"SELECT pid, taken_at, command, run_id, done, total FROM {NOTE_TABLE}").fetchall()[0]
    except duckdb.Error:
        con.close()
        return None
    note = SnapshotNote(*row)
    current = note.pid == holder_pid if holder_pid is not None else _alive(note.pid)
    if not current:
        con.close()
        return None
    return con, note


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _quoted(path: Path) -> str:
    return str(path).replace("'", "''")


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
