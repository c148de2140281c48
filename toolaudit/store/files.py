"""What a --db path must be before DuckDB opens it, and DuckDB's refusals in toolaudit's words: a folder that
exists, a DuckDB file or none (a trace log given as --db is said to be one, never offered for removal), and a file
another process holds (whose snapshot may name the toolaudit run that holds it)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import duckdb

from toolaudit import DatabaseFolderMissing, StoreError
from toolaudit.store.snapshot import open_snapshot

_LOCK_PID = re.compile(r"PID (\d+)")


class DatabaseLocked(StoreError):
    """Another process holds the file read-write (`pid`: that process, when DuckDB says)."""

    def __init__(self, message: str, pid: int | None):
        super().__init__(message)
        self.pid = pid


def open_error(path: str, exc: Exception) -> StoreError:
    text = str(exc)
    if "lock" in text.lower():
        found = _LOCK_PID.search(text)
        pid = int(found.group(1)) if found else None
        holder = f" (held by process {pid})" if pid else ""
        return DatabaseLocked(f"{path}: database is locked by another writer{holder}; wait for it to finish "
                              f"or use another --db", pid)
    if "not a valid DuckDB database" in text or "invalid" in text.lower():
        return StoreError(f"{path}: {NOT_A_DATABASE}")
    return StoreError(f"{path}: cannot open database: {text}")


def writer_locked(path: str, pid: int | None, connect: Callable[[str], duckdb.DuckDBPyConnection]
                   ) -> DatabaseLocked:
    """What a writer that finds the file held is told: not the readers' snapshot advice (a writer cannot use a
    snapshot), but to wait or write elsewhere; naming the toolaudit run that holds it when its snapshot says."""
    holder = f"held by process {pid}" if pid else "held by another process"
    found = open_snapshot(path, pid, connect) if pid else None
    if found is not None:
        found[0].close()
        note = found[1]
        holder += f": toolaudit {note.command}" + (f" run {note.run_id}" if note.run_id is not None else "")
    return DatabaseLocked(f"{path}: database is locked by another writer ({holder}); only one process may write "
                          f"a database at a time: wait for it to finish, or use another --db", pid)


# never "remove the file": the file --db names by mistake is often the user's own trace log
NOT_A_DATABASE = "not a DuckDB database file; pass the path of a toolaudit database, or a new path to create one"


def check_folder(path: str) -> None:
    """A --db in a folder that is not there: said so (DuckDB says only that it cannot open the file)."""
    folder = Path(path).parent
    if folder.is_dir():
        return
    if folder.exists():
        raise DatabaseFolderMissing(f"{path}: {folder} is a file, not a folder; pass a --db in a folder that exists")
    raise DatabaseFolderMissing(f"{path}: the folder {folder} does not exist; create it, or pass a --db in a "
                                "folder that exists")


def check_header(path: str) -> None:
    """Refuse files that are not DuckDB before DuckDB tries to interpret (or extend) them; a trace file given as
    --db is said to be one, so that it is not mistaken for a broken database."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(16)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StoreError(f"{path}: cannot read database file: {exc.strerror or exc}") from None
    if head and head[8:12] != b"DUCK":
        if head.removeprefix(b"\xef\xbb\xbf").lstrip().startswith((b"{", b"[")):
            raise StoreError(f"{path}: not a toolaudit database: it looks like a trace (JSON lines) file; give "
                             "trace files as arguments and --db the database (a new path creates one)")
        raise StoreError(f"{path}: {NOT_A_DATABASE}")
