"""New database files copied from this process's template, as PostgreSQL makes databases from `template1`.

Why: creating a file's schema (every migration, the views once: `Store.migrate`) takes ~65 ms, and the processes
that make many files (sharded compares, merges, the test suite's thousands) paid it each time; copying a migrated
empty file takes a few. The template is made once per process by the same code that migrates any new file, in a
temporary folder removed at exit. The copy is linked into place, never over a file: where `path` appeared
meanwhile (another process made it), the filesystem has no hard links or no temporary folder can hold the
template, nothing is placed and the caller opens and migrates the file as usual."""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import os
import shutil
import tempfile

import duckdb

from toolaudit.store.migrations import SCHEMA_MIGRATIONS_TABLE, create_schema

_template: str | None = None
_new_files = 0  # new files this process asked for: the first is migrated in place (see `place_new_file`)


def new_schema_file(path: str) -> None:
    """A new file with the schema (`migrations.create_schema`), closed: checkpointed, one file and no WAL."""
    con = duckdb.connect(path, config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    try:
        con.execute(SCHEMA_MIGRATIONS_TABLE)
        con.execute("BEGIN TRANSACTION")
        create_schema(con, dt.datetime.now(dt.timezone.utc).replace(tzinfo=None))
        con.execute("COMMIT")
    finally:
        con.close()


def place_new_file(path: str) -> bool:
    """A migrated empty database at `path`, which did not exist, from the template; False where nothing was placed
    (see the module docstring). A process's first new file is migrated in place and its second makes the template:
    a one-file command (most) pays nothing for it and, killed, leaves no template behind."""
    global _template, _new_files
    _new_files += 1
    if _template is None and _new_files == 1:
        return False
    if _template is None:
        try:
            folder = tempfile.mkdtemp(prefix="toolaudit-template-")
            atexit.register(_remove, folder, os.getpid())
            made = os.path.join(folder, "new.duckdb")
            new_schema_file(made)
        except (OSError, duckdb.Error):  # no usable temporary folder: every file is migrated in place
            _template = ""
            return False
        _template = made
    if not _template:
        return False
    staged = f"{path}.new-{os.getpid()}"
    try:
        shutil.copyfile(_template, staged)
        os.link(staged, path)  # no-clobber: FileExistsError where another process made `path` first
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            os.unlink(staged)
    return True


def _remove(folder: str, owner: int) -> None:
    """The template's folder, removed at exit by the process that made it (not by a forked child exiting)."""
    if os.getpid() == owner:
        shutil.rmtree(folder, ignore_errors=True)

