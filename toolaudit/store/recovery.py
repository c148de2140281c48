"""Roll back the compare runs a dead writer left behind.

A compare run is written in several transactions (the Python-built rows, then the agreeing pairs' rows in
bounded transactions: one would hold every new key in memory), so a `kill -9` or a crash can leave a run that
holds part of its calls with status `running`, or `interrupted` after Ctrl-C. Unlike a replay (resumed call by
call with `replay --resume`), a comparison is cheap to run again and has no partial state worth keeping; so
the next process that opens the file read-write deletes such a run's rows and marks it `interrupted`, with
counts `{"rolled_back": true}` (the run row stays, saying what happened). Readers meanwhile see the run as
`running` or `interrupted` with some of its calls, each call whole (see `staging.Staging.write_agreeing`).

DuckDB lets one process at a time hold a file read-write, so a `running` run found by a writer was started by
this process or by a dead one: this process's own runs are in `LIVE` until they finish.
"""

from __future__ import annotations

import os

import duckdb

# (real path of the file, run id) of the compare runs this process is writing
LIVE: set[tuple[str, int]] = set()
# every table holding a compare run's rows, by run
_RUN_TABLES = ("arg_diffs", "outputs", "calls", "sessions", "trace_errors", "schema_issues")
ROLLED_BACK = '{"rolled_back": true}'


def live_key(path: str, run_id: int) -> tuple[str, int]:
    return os.path.realpath(path), run_id


def roll_back_dead_compares(con: duckdb.DuckDBPyConnection, path: str) -> list[int]:
    """Delete the rows of compare runs left unfinished by another (dead) process, in one transaction; returns
    their ids."""
    found = con.execute("SELECT run_id FROM runs WHERE kind = 'compare' AND (status = 'running' OR "
                        "(status = 'interrupted' AND counts IS NULL)) ORDER BY run_id").fetchall()
    dead = [run_id for (run_id,) in found if live_key(path, run_id) not in LIVE]
    if not dead:
        return []
    marks = ", ".join("?" * len(dead))
    con.execute("BEGIN TRANSACTION")
    try:
        for table in _RUN_TABLES:
            con.execute(f"DELETE FROM {table} WHERE run_id IN ({marks})", dead)
        con.execute(f"UPDATE runs SET status = 'interrupted', counts = ? WHERE run_id IN ({marks})",
                    [ROLLED_BACK, *dead])
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")
    return dead
