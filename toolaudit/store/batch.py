"""The SQL of `toolaudit batch import`: each side's results wait in `staged_results` until the other side's
arrive; a call whose two sides are staged is written (replacing an earlier error row for it) in one
transaction, and its staged results are dropped once it pairs cleanly."""

from __future__ import annotations

import pyarrow as pa

from toolaudit.store.db import Store, insert_tables
from toolaudit.store.rows import RowBuffer, json_text
from toolaudit.store.vocabulary import MatchStatus


def _keys(keys: list[tuple[str, int]]) -> pa.Table:
    return pa.table({"session_id": pa.array([k[0] for k in keys], pa.string()),
                     "call_index": pa.array([k[1] for k in keys], pa.int32())})


def final_keys(store: Store, run_id: int) -> set[tuple[str, int]]:
    """Calls of the run already written as a pair (error rows excluded: a later import may fix them)."""
    rows = store.con.execute("SELECT session_id, call_index FROM calls WHERE run_id = ? AND match_status <> ?",
                             [run_id, MatchStatus.ERROR.value]).fetchall()
    return {(s, i) for s, i in rows}


def stage(store: Store, run_id: int, side: str, staged: RowBuffer, errors: RowBuffer) -> None:
    """Stage one side's results (replacing that side's earlier staged results for the same calls) and add the
    import's trace error rows (replacing the side's earlier ones), in one transaction."""
    keys = [(r[1], r[2]) for r in staged.rows["staged_results"]]
    with store.transaction() as con:
        if keys:
            con.register("_keys", _keys(keys))
            con.execute("DELETE FROM staged_results WHERE run_id = ? AND side = ? AND (session_id, call_index) IN "
                        "(SELECT session_id, call_index FROM _keys)", [run_id, side])
            con.unregister("_keys")
        con.execute("DELETE FROM trace_errors WHERE run_id = ? AND side = ?", [run_id, side])
        insert_tables(con, [*staged.tables(), *errors.tables()])


def staged_pairs(store: Store, run_id: int, keys: list[tuple[str, int]]) -> list[tuple]:
    """(session, call index, baseline path, baseline result, candidate path, candidate result) of the given
    calls whose two sides are staged."""
    if not keys:
        return []
    store.con.register("_keys", _keys(keys))
    try:
        return store.con.execute("""
            SELECT b.session_id, b.call_index, b.path_name, b.result, c.path_name, c.result
            FROM staged_results b JOIN staged_results c USING (run_id, session_id, call_index)
            JOIN _keys k USING (session_id, call_index)
            WHERE b.run_id = ? AND b.side = 'baseline' AND c.side = 'candidate'
            ORDER BY b.session_id, b.call_index""", [run_id]).fetchall()
    finally:
        store.con.unregister("_keys")


def write_pairs(store: Store, run_id: int, rows: RowBuffer, written: list[tuple[str, int]],
                unstage: list[tuple[str, int]]) -> None:
    """Replace the rows of the `written` calls with the buffer's and drop the staged results of `unstage`, in
    one transaction (a kill keeps both or neither, so importing again neither loses nor repeats a call)."""
    with store.transaction() as con:
        _delete(con, run_id, written, ("arg_diffs", "outputs", "calls"))
        insert_tables(con, rows.tables())
        _delete(con, run_id, unstage, ("staged_results",))


def _delete(con, run_id: int, keys: list[tuple[str, int]], tables: tuple[str, ...]) -> None:
    if not keys:
        return
    con.register("_keys", _keys(keys))
    for table in tables:
        con.execute(f"DELETE FROM {table} WHERE run_id = ? AND (session_id, call_index) IN "
                    "(SELECT session_id, call_index FROM _keys)", [run_id])
    con.unregister("_keys")


def set_side(store: Store, run_id: int, side: str, name: str, source: str, fingerprint: str | None,
             options: dict) -> None:
    """Record which decode path and file a side of a batch run came from."""
    if side not in ("baseline", "candidate"):
        raise ValueError(side)
    store.con.execute(f"UPDATE runs SET {side}_name = ?, {side}_source = ?, {side}_fingerprint = ?, options = ? "
                      "WHERE run_id = ?", [name, source, fingerprint, json_text(options), run_id])
