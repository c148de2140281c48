"""The SQL half of `compare`, and the one writer of a compare run's rows.

Scanned digests are appended to a DuckDB staging table, and call indices, the join by (session, call index),
and the rows of every agreeing, truncated or unmatched pair are computed there, so memory stays flat as logs
grow (DuckDB spills past its memory limit) and only the ~1% of pairs that differ come back to Python. Those pairs' rows
(built by `compare.pairs.Analyzer` into a `RowBuffer`), the run's trace error and schema issue rows, and the
agreeing pairs' rows (INSERT ... SELECT from the digests) are all written here, through the `Store`'s
transactions: `Staging.write` and `Staging.write_agreeing`.

Call indices follow `traces.CallIndexer` exactly: within a session, in line order, an explicit index `e` is kept
and moves the next implicit index to at least `e + 1`; an implicit one takes the next index. With `I` the implicit
rows so far (this one included) and `M` the largest `e + 1 - I` of the explicit rows so far, an implicit row's
index is `I - 1 + max(0, M)`. A repeated (session, index) is a duplicate: an error row, as in a sequential read.

Pairing by request (`by_request`, when the logs carry no session key, or one every call shares) keys each call
by its request digest instead: session `request-<first 20 hex digits of the digest>`, call index the call's
occurrence among the calls with that digest, in line order; the same rule then pairs the two logs.

A pair is compared only when both sides answer the same request and neither was cut at max_tokens
(`compare.attribution`): a pair whose request digests differ goes to Python with the differing pairs (which
describes what differs, and stores it as `mismatched`); a pair with a `length` finish reason on either side is
written here as `truncated`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from toolaudit.store.db import Store
from toolaudit.store.rows import RowBuffer
from toolaudit.store.vocabulary import LENGTH, TRUNCATED_BOTH, TRUNCATED_ONE, DriftKind, MatchStatus

SCAN, INDEX, PAIRS, CVAL, CHUNKS, OUT = "_ta_scan", "_ta_index", "_ta_pairs", "_ta_cval", "_ta_chunks", "_ta_out"
_SAME_TEXT = (f"CASE WHEN b.text_hash = c.text_hash THEN '{DriftKind.IDENTICAL.value}' "
              f"ELSE '{DriftKind.TEXT_ONLY.value}' END")
# rows per transaction of the final inserts: DuckDB keeps a transaction's new primary-key entries in memory
ROWS_PER_COMMIT = 500_000
# how a (session, call index) key is resolved (DIFFER: in Python, the pairs of different requests included)
FAST, BASELINE_ONLY, CANDIDATE_ONLY, DIFFER, TRUNCATED = 0, 1, 2, 3, 4
SIDES = ("baseline", "candidate")
REQUEST_SESSION = "request-"  # the session of calls paired by request: this, then 20 hex digits of the digest


def _sql_text(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _truncated_detail(cut: str, other: str) -> str:
    return (_sql_text(TRUNCATED_ONE.format(side=SIDES[0] if cut == "b" else SIDES[1],
                                           other=SIDES[1] if cut == "b" else SIDES[0]))
            + f" || coalesce({other}.finish_reason, 'no finish reason')")


_TRUNCATED_DETAIL = (f"CASE WHEN b.finish_reason = '{LENGTH}' AND c.finish_reason = '{LENGTH}' "
                     f"THEN {_sql_text(TRUNCATED_BOTH)} WHEN b.finish_reason = '{LENGTH}' "
                     f"THEN {_truncated_detail('b', 'c')} ELSE {_truncated_detail('c', 'b')} END")

_CREATE_SCAN = f"""
CREATE OR REPLACE TEMP TABLE {SCAN} (
    side UTINYINT, line BIGINT, shown BIGINT, "offset" BIGINT, session_id VARCHAR, explicit_index BIGINT,
    customer VARCHAR, sig BLOB, simple BOOLEAN, text_hash BLOB, raw_hash BLOB, status VARCHAR, valid BOOLEAN,
    no_errors BOOLEAN, tool_name VARCHAR, tools_hash BLOB, has_content BOOLEAN, finish_reason VARCHAR,
    request_digest BLOB)"""

_WINDOW = "PARTITION BY side, session_id ORDER BY line ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW"
_INDEX = f"""
CREATE OR REPLACE TEMP TABLE {INDEX} AS
WITH a AS (
    SELECT side, line, shown, session_id, explicit_index,
           sum(CASE WHEN explicit_index IS NULL THEN 1 ELSE 0 END) OVER ({_WINDOW}) AS implicit_so_far
    FROM {SCAN}),
b AS (
    SELECT *, max(CASE WHEN explicit_index IS NOT NULL THEN explicit_index + 1 - implicit_so_far END)
              OVER ({_WINDOW}) AS lead
    FROM a),
c AS (
    SELECT side, line, shown, session_id,
           coalesce(explicit_index, implicit_so_far - 1 + greatest(0, coalesce(lead, 0))) AS call_index
    FROM b)
SELECT side, line, session_id, call_index,
       row_number() OVER k AS rank, first_value(shown) OVER k AS first_shown
FROM c WINDOW k AS (PARTITION BY side, session_id, call_index ORDER BY line)"""

_PAIRS = f"""
CREATE OR REPLACE TEMP TABLE {PAIRS} AS
WITH s AS (
    SELECT i.side, i.line, i.session_id, i.call_index, x.sig, x.simple, x.status, x.tools_hash, x.no_errors,
           x.finish_reason, x.request_digest
    FROM {INDEX} i JOIN {SCAN} x USING (side, line) WHERE i.rank = 1),
j AS (
    SELECT b.line AS bl, c.line AS cl, coalesce(b.session_id, c.session_id) AS session_id,
           coalesce(b.call_index, c.call_index) AS call_index,
           CASE WHEN b.line IS NULL THEN {CANDIDATE_ONLY} WHEN c.line IS NULL THEN {BASELINE_ONLY}
                WHEN b.request_digest <> c.request_digest THEN {DIFFER}
                WHEN b.finish_reason = '{LENGTH}' OR c.finish_reason = '{LENGTH}' THEN {TRUNCATED}
                WHEN b.simple AND c.simple AND b.status = c.status AND b.sig = c.sig THEN {FAST}
                ELSE {DIFFER} END AS how,
           b.tools_hash = c.tools_hash AND b.no_errors AS same_schemas
    FROM (SELECT * FROM s WHERE side = 0) b
    FULL OUTER JOIN (SELECT * FROM s WHERE side = 1) c
    ON b.session_id = c.session_id AND b.call_index = c.call_index)
SELECT row_number() OVER () - 1 AS seq, bl, cl, session_id, call_index, how,
       how = {CANDIDATE_ONLY} OR (how = {FAST} AND NOT same_schemas) AS check_candidate
FROM j"""

# matched pairs that agree, truncated pairs, and calls in one log only: calls and outputs rows straight from the
# digests (a truncated pair has no verdict: neither kind nor validity); the recorded call's tool is the baseline
# log's first tool call (`pairs.first_tool`; NULL for a call in the candidate log only)
_FAST_CALLS = f"""
INSERT INTO calls BY NAME
SELECT $run_id AS run_id, p.session_id, p.call_index,
       coalesce(b.customer, c.customer) AS customer,
       CASE WHEN p.how IN ({FAST}, {TRUNCATED}) THEN coalesce(nullif(b.tool_name, ''), c.tool_name)
            ELSE coalesce(b.tool_name, c.tool_name) END AS tool_name,
       CASE p.how WHEN {FAST} THEN '{MatchStatus.MATCHED.value}' WHEN {BASELINE_ONLY}
            THEN '{MatchStatus.BASELINE_ONLY.value}' WHEN {TRUNCATED} THEN '{MatchStatus.TRUNCATED.value}'
            ELSE '{MatchStatus.CANDIDATE_ONLY.value}' END AS match_status,
       CASE WHEN p.how = {FAST} THEN {_SAME_TEXT} END AS drift_kind,
       CASE WHEN p.how = {FAST} THEN false END AS drifted,
       CASE WHEN p.how IN ({FAST}, {TRUNCATED}) THEN b.raw_hash = c.raw_hash END AS exact_text_match,
       CASE WHEN p.how = {FAST} THEN b.valid END AS baseline_valid,
       CASE WHEN p.how = {FAST} THEN CASE WHEN p.check_candidate THEN v.valid ELSE b.valid END END
           AS candidate_valid,
       CASE WHEN p.how = {FAST} THEN 0 END AS arg_diff_count,
       CASE p.how WHEN {BASELINE_ONLY} THEN 'present in the baseline log only'
            WHEN {CANDIDATE_ONLY} THEN 'present in the candidate log only'
            WHEN {TRUNCATED} THEN {_TRUNCATED_DETAIL} END AS detail,
       nullif(b.tool_name, '') AS recorded_tool
FROM {PAIRS} p
LEFT JOIN {SCAN} b ON b.side = 0 AND b.line = p.bl
LEFT JOIN {SCAN} c ON c.side = 1 AND c.line = p.cl
LEFT JOIN {CVAL} v ON v.line = p.cl
WHERE p.how <> {DIFFER} AND p.seq >= $lo AND p.seq < $hi"""

# the outputs rows of those pairs: one row per side present, keyed by (side, line)
_OUT = f"""
CREATE OR REPLACE TEMP TABLE {OUT} AS
SELECT o.side, o.line, o.session_id, o.call_index, x.shown, x.status, o.check_candidate, x.finish_reason,
       lower(hex(x.request_digest)) AS request_digest
FROM (SELECT 0 AS side, bl AS line, session_id, call_index, false AS check_candidate FROM {PAIRS}
      WHERE how IN ({FAST}, {BASELINE_ONLY}, {TRUNCATED})
      UNION ALL
      SELECT 1, cl, session_id, call_index, check_candidate FROM {PAIRS}
      WHERE how IN ({FAST}, {CANDIDATE_ONLY}, {TRUNCATED})) o
JOIN {SCAN} x ON x.side = o.side AND x.line = o.line"""

# streamed from the workers' Parquet files; a candidate scanned without validating takes its checked verdict,
# or none (its identical baseline had no schema errors)
_FAST_OUTPUTS = f"""
INSERT INTO outputs BY NAME
SELECT $run_id AS run_id, o.session_id, o.call_index, CASE WHEN o.side = 0 THEN 'baseline' ELSE 'candidate' END
           AS side,
       CASE WHEN o.side = 0 THEN $b_name ELSE $c_name END AS path_name,
       CASE WHEN o.side = 0 THEN $b_source ELSE $c_source END AS source,
       o.shown AS line, w.raw AS text, w.tool_calls, o.status AS parse_status, w.fmt AS parse_format,
       w.error AS parse_error,
       CASE WHEN o.check_candidate THEN v.schema_errors ELSE w.schema_errors END AS schema_errors,
       w.fingerprint AS system_fingerprint, o.finish_reason, o.request_digest
FROM read_parquet({{files}}, filename = true) w
JOIN {CHUNKS} k ON k.file = w.filename
JOIN {OUT} o ON o.side = k.side AND o.line = w.line + k.base
LEFT JOIN {CVAL} v ON o.check_candidate AND v.line = o.line
WHERE {{lines}}"""


class Staging:
    """The staging tables of one comparison on the store's connection (temporary: gone when it closes), and the
    writer of the comparison's rows."""

    def __init__(self, store: Store):
        self.store = store
        self.con = store.con
        self.con.execute(_CREATE_SCAN)
        self.con.execute(f"CREATE OR REPLACE TEMP TABLE {CVAL} (line BIGINT, valid BOOLEAN, schema_errors VARCHAR)")
        self.con.execute(f"CREATE OR REPLACE TEMP TABLE {CHUNKS} (file VARCHAR, side UTINYINT, base BIGINT)")
        self.chunks: list[tuple[str, int, int, int]] = []  # (outputs file, side, line base, lines), in line order

    def append(self, side: int, table: pa.Table, line_base: int, lines: int, shown: pa.Array | None,
               outputs_file: str | None) -> None:
        """One chunk's digests (and the Parquet file of their outputs columns; the chunk's `lines` follow
        `line_base`); `shown` maps a converted log's lines (1-based) to the original file's."""
        if outputs_file is not None:
            self.chunks.append((outputs_file, side, line_base, lines))
            self.con.execute(f"INSERT INTO {CHUNKS} VALUES (?, ?, ?)", [outputs_file, side, line_base])
        line = pc.add(table.column("line"), line_base)
        shown_line = line if shown is None else shown.take(pc.subtract(line, 1))
        chunk = table.set_column(0, "line", line).append_column("side", pa.repeat(pa.scalar(side, pa.uint8()),
                                                                                   len(table)))
        chunk = chunk.append_column("shown", shown_line)
        self._insert(SCAN, chunk)

    def _insert(self, name: str, table: pa.Table) -> None:
        self.con.register("_ta_chunk", table)
        try:
            self.con.execute(f"INSERT INTO {name} BY NAME SELECT * FROM _ta_chunk")
        finally:
            self.con.unregister("_ta_chunk")

    def index(self) -> list[dict[str, Any]]:
        """Assign call indices; returns the duplicates (side, line, shown, offset, session_id, call_index,
        first_shown) in line order."""
        self.con.execute(_INDEX)
        return _dicts(self.con.execute(
            f"SELECT i.side, i.line, x.shown, x.\"offset\", i.session_id, i.call_index, i.first_shown "
            f"FROM {INDEX} i JOIN {SCAN} x USING (side, line) WHERE i.rank > 1 ORDER BY i.side, i.line"))

    def sessions(self) -> dict[int, tuple[int, int, int]]:
        """Per side: (calls, calls without a session, distinct sessions of the others)."""
        rows = self.con.execute(
            f"SELECT side, count(*), count(*) FILTER (WHERE session_id = ''), "
            f"count(DISTINCT nullif(session_id, '')) FROM {SCAN} GROUP BY side").fetchall()
        return {row[0]: (row[1], row[2], row[3]) for row in rows}

    def mismatched_by_key(self) -> int:
        """Pairs by (session, call index) whose two requests differ (call indices assigned: `index`)."""
        return self.con.execute(
            f"SELECT count(*) FROM {INDEX} b JOIN {INDEX} c USING (session_id, call_index) "
            f"JOIN {SCAN} xb ON xb.side = 0 AND xb.line = b.line JOIN {SCAN} xc ON xc.side = 1 AND xc.line = c.line "
            f"WHERE b.side = 0 AND c.side = 1 AND b.rank = 1 AND c.rank = 1 "
            f"AND xb.request_digest <> xc.request_digest").fetchall()[0][0]

    def by_request(self) -> None:
        """Key every call by its request: session `request-<digest>`, index its occurrence (see the module
        docstring)."""
        self.con.execute(f"UPDATE {SCAN} SET session_id = '{REQUEST_SESSION}' || "
                         f"left(lower(hex(request_digest)), 20), explicit_index = NULL")

    def take_sessionless(self) -> list[dict[str, Any]]:
        """The calls without a session (side, line, shown, offset), in line order, taken out of the stage."""
        rows = _dicts(self.con.execute(f"SELECT side, line, shown, \"offset\" FROM {SCAN} WHERE session_id = '' "
                                       f"ORDER BY side, line"))
        if rows:
            self.con.execute(f"DELETE FROM {SCAN} WHERE session_id = ''")
        return rows

    def call_gaps(self, no_tools_hash: bytes) -> dict[int, tuple[int, int, int, int, int]]:
        """Per side: (calls, without message content, without tools, without customer, distinct sessions)."""
        rows = self.con.execute(
            f"SELECT side, count(*), count(*) FILTER (WHERE NOT has_content), "
            f"count(*) FILTER (WHERE tools_hash = ?), count(*) FILTER (WHERE customer IS NULL), "
            f"count(DISTINCT session_id) FROM {SCAN} GROUP BY side", [no_tools_hash]).fetchall()
        return {row[0]: tuple(row[1:]) for row in rows}

    def pair(self) -> dict[int, int]:
        """Join the two sides; returns how many keys each `how` holds."""
        self.con.execute(_PAIRS)
        return dict(self.con.execute(f"SELECT how, count(*) FROM {PAIRS} GROUP BY how").fetchall())

    def fast_kinds(self) -> dict[str, int]:
        return dict(self.con.execute(
            f"SELECT {_SAME_TEXT} AS kind, count(*) "
            f"FROM {PAIRS} p JOIN {SCAN} b ON b.side = 0 AND b.line = p.bl "
            f"JOIN {SCAN} c ON c.side = 1 AND c.line = p.cl WHERE p.how = {FAST} GROUP BY kind").fetchall())

    def differing(self, limit: int) -> Iterator[list[dict[str, Any]]]:
        """Pairs to diff in full (both lines and offsets, the key, the customer), in pages of `limit`."""
        return self._pages(
            f"SELECT p.bl, b.\"offset\" AS b_offset, p.cl, c.\"offset\" AS c_offset, p.session_id, p.call_index, "
            f"coalesce(b.customer, c.customer) AS customer FROM {PAIRS} p "
            f"JOIN {SCAN} b ON b.side = 0 AND b.line = p.bl JOIN {SCAN} c ON c.side = 1 AND c.line = p.cl "
            f"WHERE p.how = {DIFFER} ORDER BY p.bl", limit)

    def candidates_to_check(self, limit: int) -> Iterator[list[dict[str, Any]]]:
        """Candidate lines whose schema verdict must be computed on their own (scanned without validating)."""
        return self._pages(
            f"SELECT p.cl AS line, c.\"offset\" FROM {PAIRS} p JOIN {SCAN} c ON c.side = 1 AND c.line = p.cl "
            f"WHERE p.check_candidate ORDER BY p.cl", limit)

    def add_checked(self, rows: list[tuple[int, bool | None, str | None]]) -> None:
        if rows:
            lines, valid, errors = zip(*rows)
            self._insert(CVAL, pa.table({"line": pa.array(lines, pa.int64()), "valid": pa.array(valid, pa.bool_()),
                                         "schema_errors": pa.array(errors, pa.string())}))

    # -- the one writer of the run's rows ---------------------------------------------------------------------
    def write(self, rows: RowBuffer) -> None:
        """Rows built in Python, in one transaction: the differing pairs' calls, outputs and arg_diffs, and the
        run's trace_errors and schema_issues."""
        self.store.write_rows(rows)

    def write_agreeing(self, run_id: int, names: tuple[str, str], sources: tuple[str, str]) -> None:
        """Insert the calls and outputs rows of every agreeing or unmatched pair, at most ROWS_PER_COMMIT rows
        per transaction (so memory does not grow with the logs): outputs by groups of consecutive chunk files
        (each group's Parquet files are read once), then calls by ranges of pairs. Outputs first: a process
        killed between two of these transactions leaves outputs rows waiting for their calls, never a call
        without its outputs (and the next writer rolls the run back: `recovery.py`)."""
        params: dict[str, Any] = {"run_id": run_id, "b_name": names[0], "c_name": names[1],
                                  "b_source": sources[0], "c_source": sources[1]}
        self.con.execute(_OUT)
        for group in self._groups():
            files = "[" + ", ".join("'" + f.replace("'", "''") + "'" for f, *_ in group) + "]"
            ranges = []
            for side in sorted({c[1] for c in group}):
                mine = [c for c in group if c[1] == side]
                ranges.append(f"(o.side = {side} AND o.line >= {mine[0][2] + 1} "
                              f"AND o.line < {mine[-1][2] + mine[-1][3] + 1})")
            self._commit(_FAST_OUTPUTS.format(files=files, lines=" OR ".join(ranges)), params)
        total = self.con.execute(f"SELECT count(*) FROM {PAIRS}").fetchall()[0][0]
        for lo in range(0, total, ROWS_PER_COMMIT):
            self._commit(_FAST_CALLS, {"run_id": run_id, "lo": lo, "hi": lo + ROWS_PER_COMMIT})

    def _groups(self) -> Iterator[list[tuple[str, int, int, int]]]:
        """Consecutive chunks (in line order, baseline first) holding at most ROWS_PER_COMMIT lines together
        (or one chunk)."""
        group: list[tuple[str, int, int, int]] = []
        for chunk in self.chunks:
            if group and sum(c[3] for c in group) + chunk[3] > ROWS_PER_COMMIT:
                yield group
                group = []
            group.append(chunk)
        if group:
            yield group

    def _commit(self, sql: str, params: dict[str, Any]) -> None:
        with self.store.transaction() as con:
            con.execute(sql, params)

    def _pages(self, sql: str, limit: int) -> Iterator[list[dict[str, Any]]]:
        table = self.con.sql(sql).to_arrow_table()  # narrow columns: small even for many rows
        for start in range(0, len(table), limit):
            yield table.slice(start, limit).to_pylist()

    def drop(self) -> None:
        for name in (SCAN, INDEX, PAIRS, CVAL, CHUNKS, OUT):
            self.con.execute(f"DROP TABLE IF EXISTS {name}")


@contextmanager
def staging(store: Store, memory_limit: str | None = None) -> Iterator[Staging]:
    """Staging tables for one comparison; with `memory_limit`, DuckDB spills past it to its temp directory
    (the setting is put back afterwards)."""
    con = store.con
    before = con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0] if memory_limit else None
    if memory_limit:
        con.execute("SET memory_limit = ?", [memory_limit])
    try:
        stage = Staging(store)
        try:
            yield stage
        finally:
            stage.drop()
    finally:
        if before is not None:
            con.execute("SET memory_limit = ?", [before])


def _dicts(result: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    names = [d[0] for d in result.description]
    return [dict(zip(names, row)) for row in result.fetchall()]
