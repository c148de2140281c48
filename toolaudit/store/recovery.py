"""Settle the runs a dead writer left `running`: roll back its compare runs, mark its other runs interrupted.

A compare run is written in several transactions (the Python-built rows, then the agreeing pairs' rows in
bounded transactions: one would hold every new key in memory), so a `kill -9` or a crash can leave a run that
holds part of its calls with status `running`, or `interrupted` after Ctrl-C. Unlike a replay (resumed call by
call with `replay --resume`), a comparison is cheap to run again and has no partial state worth keeping; so
the next process that opens the file read-write deletes such a run's rows and marks it `interrupted`, with
counts `{"rolled_back": true}` (the run row stays, saying what happened). A replay or matrix run left `running`
is marked `interrupted` and keeps its rows (whole chunks) for `replay --resume`. A batch run is `running` while
it waits for its other side, which is no crash: left alone. Until a writer opens the file, readers see such a
run as `running`, each of its calls whole (see `staging.Staging.write_agreeing`).

DuckDB lets one process at a time hold a file read-write, so a `running` run found by a writer was started by
this process or by a dead one: this process's own runs are in `LIVE` until they finish.
"""

from __future__ import annotations

import contextlib
import os

import duckdb

# (real path of the file, run id) of the runs this process is writing
LIVE: set[tuple[str, int]] = set()
# every table holding a compare run's rows, by run
_RUN_TABLES = ("arg_diffs", "outputs", "calls", "sessions", "trace_errors", "schema_issues")
ROLLED_BACK = '{"rolled_back": true}'


def live_key(path: str, run_id: int) -> tuple[str, int]:
    return os.path.realpath(path), run_id


def settle_dead_runs(con: duckdb.DuckDBPyConnection, path: str) -> list[int]:
    """Roll back the compare runs and mark interrupted the replay and matrix runs that another (dead) process
    left unfinished, in one transaction; returns their ids."""
    found = con.execute("SELECT run_id, kind FROM runs WHERE kind <> 'batch' AND (status = 'running' OR "
                        "(kind = 'compare' AND status = 'interrupted' AND counts IS NULL)) ORDER BY run_id").fetchall()
    dead = [(run_id, kind) for run_id, kind in found if live_key(path, run_id) not in LIVE]
    if not dead:
        return []
    compares = [run_id for run_id, kind in dead if kind == "compare"]
    others = [run_id for run_id, kind in dead if kind != "compare"]
    con.execute("BEGIN TRANSACTION")
    try:
        if compares:
            marks = ", ".join("?" * len(compares))
            for table in _RUN_TABLES:
                con.execute(f"DELETE FROM {table} WHERE run_id IN ({marks})", compares)
            con.execute(f"UPDATE runs SET status = 'interrupted', counts = ? WHERE run_id IN ({marks})",
                        [ROLLED_BACK, *compares])
        if others:
            con.execute(f"UPDATE runs SET status = 'interrupted' WHERE run_id IN ({', '.join('?' * len(others))})",
                        others)
        con.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(duckdb.Error):  # a COMMIT that failed has ended the transaction itself
            con.execute("ROLLBACK")
        raise
    return [run_id for run_id, _ in dead]
