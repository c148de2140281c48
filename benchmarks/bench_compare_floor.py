"""How fast could `compare` possibly be? The parts no design avoids, measured side by side on the same logs.

    python benchmarks/bench_compare_floor.py -n 1000000 --keep DIR     # DIR: bench_analysis.py's folder
    python benchmarks/bench_compare_floor.py -n 200000 --compare        # also the real compare, for reference

Whatever decides agreement (Python, SQL, a worker pool, Ray), a comparison of N recorded pairs must at least:

1. **read** both logs: each line read as text by DuckDB's `read_csv` and parsed once by `json_transform` (C++,
   every thread) into only what a call's digest needs (the metadata keys, the messages' roles and content, the
   tools as JSON, the answer's message), in a table;
2. **write** what the store holds for every agreeing pair: one `calls` row and two `outputs` rows (each side's
   exact answer text and its parsed tool calls), into a real store file with its keys, in one transaction;
3. **judge** the baseline's arguments against their schema (a `calls` column): JSON Schema has no SQL form, so
   this is Python per call even on the compiled fast path (`validate.fastpath`): `orjson.loads` of the argument
   string plus the check.

Each part is timed alone, on the machine's cores, and printed as the pairs/s it alone would allow. The floor
is read + write (both already use every core) plus the Python part spread perfectly over the cores: no
staging, no join, no diff, no bookkeeping. A compare cannot beat it on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_analysis import TOOLS, _cpu, _generated, run_fast  # noqa: E402

from toolaudit.compare.pairs import Analyzer  # noqa: E402
from toolaudit.store import Store  # noqa: E402
from toolaudit.validate.schemas import SchemaRegistry  # noqa: E402

GOAL = 50_000  # pairs/s at 1,000,000 pairs on a 2-core AVX2-only machine (issue 24)

# What a digest reads of a line (`compare.scan.digest`): keys, whether a message says something, the tools (to
# hash and compile), the answer's message and fingerprint. Typed where the shape is fixed, JSON where it is not.
_SHAPE = json.dumps({
    "request": {"metadata": "JSON", "messages": [{"role": "VARCHAR", "content": "JSON", "tool_calls": "JSON"}],
                "tools": "JSON"},
    "response": {"system_fingerprint": "VARCHAR", "choices": [{"message": {"content": "VARCHAR", "tool_calls": [
        {"id": "VARCHAR", "type": "VARCHAR", "function": {"name": "VARCHAR", "arguments": "VARCHAR"}}]}}]},
})
_READ = """
CREATE OR REPLACE TEMP TABLE {table} AS
SELECT request.metadata ->> 'session_id' AS session_id, request.metadata ->> 'customer' AS customer,
       request.metadata ->> 'call_index' AS call_index,
       list_bool_or([m.content IS NOT NULL AND m.content::VARCHAR NOT IN ('null', '""')
                     for m in request.messages]) AS has_content,
       hash(request.tools::VARCHAR) AS tools_hash, response.system_fingerprint AS fingerprint,
       response.choices[1].message.content AS content,
       response.choices[1].message.tool_calls[1].function.name AS name,
       response.choices[1].message.tool_calls[1].function.arguments AS arguments
FROM (SELECT r.request AS request, r.response AS response
      FROM (SELECT json_transform(line, '{shape}') AS r
            FROM read_csv({path}, columns = {{'line': 'VARCHAR'}}, delim = chr(0), quote = '', escape = '',
                          header = false, auto_detect = false)))"""

# The rows an agreeing pair stores, shaped as `compare` shapes them (texts of the same size).
_ROWS = """
CREATE OR REPLACE TEMP TABLE rows_out AS
SELECT 1 AS run_id, session_id, call_index::INTEGER AS call_index, side, side AS path_name, 'log.jsonl' AS source,
       line, coalesce(content, '') || chr(1) || name || chr(0) || arguments AS text,
       '[{"name":' || to_json(name) || ',"arguments":' || json(arguments) || '}]' AS tool_calls,
       'ok' AS parse_status, 'openai_tool_calls' AS parse_format, NULL AS parse_error, NULL AS schema_errors,
       fingerprint AS system_fingerprint
FROM (SELECT *, rowid + 1 AS line, 'baseline' AS side FROM side_b
      UNION ALL SELECT *, rowid + 1 AS line, 'candidate' AS side FROM side_c);
CREATE OR REPLACE TEMP TABLE rows_calls AS
SELECT 1 AS run_id, session_id, call_index::INTEGER AS call_index, customer, name AS tool_name,
       'matched' AS match_status, 'text_only' AS drift_kind, false AS drifted, false AS exact_text_match,
       true AS baseline_valid, true AS candidate_valid, 0 AS arg_diff_count
FROM side_b"""


def read_logs(con: duckdb.DuckDBPyConnection, b: Path, c: Path) -> float:
    """Both logs into tables, in file order (DuckDB keeps insertion order, so a row's `rowid` + 1 is its line
    in these logs, which have no blank or bad lines; `row_number() OVER ()` would serialize the read).

    Each line is read as text by `read_csv` (no delimiter, no quoting) and parsed once by `json_transform`:
    `read_csv` splits one file over every thread, where `read_ndjson` reads one file on one thread (measured
    here: 0.57 GB/s with 2 threads for a bare count, against 1.16 GB/s this way)."""
    start = time.perf_counter()
    for table, path in (("side_b", b), ("side_c", c)):
        con.execute(_READ.format(table=table, path="'" + str(path).replace("'", "''") + "'", shape=_SHAPE))
    return time.perf_counter() - start


def write_rows(con: duckdb.DuckDBPyConnection, db: Path) -> float:
    """The agreeing pairs' rows into a fresh store (its real schema and keys), timed from rows already built."""
    con.execute(_ROWS)
    db.unlink(missing_ok=True)
    Store(db).close()  # the schema, as migrations create it
    con.execute(f"ATTACH '{db}' AS store")
    con.execute("INSERT INTO store.runs (run_id, kind, status, created_at) VALUES (1, 'compare', 'running', now())")
    con.execute("CHECKPOINT store")
    start = time.perf_counter()
    con.execute("BEGIN")
    con.execute("INSERT INTO store.outputs BY NAME SELECT * FROM rows_out")
    con.execute("INSERT INTO store.calls BY NAME SELECT * FROM rows_calls")
    con.execute("COMMIT")
    con.execute("CHECKPOINT store")
    elapsed = time.perf_counter() - start
    con.execute("DETACH store")
    return elapsed


def judge_baseline(con: duckdb.DuckDBPyConnection) -> tuple[float, int]:
    """orjson.loads + the compiled fast-path check of every baseline call's arguments, in one Python thread."""
    analyzer = Analyzer(0, SchemaRegistry(None))
    schemas = analyzer.schemas_for(TOOLS)
    checks = {name: compiled._fast for name, compiled in schemas.items()}
    batches = con.sql("SELECT name, arguments FROM side_b").to_arrow_reader(100_000)
    elapsed, valid = 0.0, 0
    for batch in batches:
        names, arguments = batch.column(0).to_pylist(), batch.column(1).to_pylist()
        start = time.perf_counter()
        for name, text in zip(names, arguments):
            valid += checks[name](orjson.loads(text))
        elapsed += time.perf_counter() - start
    return elapsed, valid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=1_000_000, help="call pairs")
    parser.add_argument("--keep", type=Path, help="bench_analysis.py's folder of generated logs (reused)")
    parser.add_argument("--compare", action="store_true", help="also time the real compare + store, end to end")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="toolaudit-floor-"))
    b, c = _generated(args.n, work / f"n{args.n}")
    cores = os.cpu_count() or 1
    con = duckdb.connect()
    con.execute(f"SET threads = {cores}")

    read_s = read_logs(con, b, c)
    write_s = write_rows(con, work / "floor.duckdb")
    judge_s, valid = judge_baseline(con)
    floor_s = read_s + write_s + judge_s / cores
    size_gb = (b.stat().st_size + c.stat().st_size) / 1e9

    def rate(seconds: float) -> str:
        return f"{args.n / seconds:>12,.0f} pairs/s"

    print(f"{args.n:,} pairs, {size_gb:.2f} GB of JSONL; {cores} cores ({_cpu()})")
    print(f"  read both logs (json_transform, {cores} threads) {read_s:6.2f} s {rate(read_s)}  "
          f"({size_gb / read_s:.2f} GB/s)")
    print(f"  write {args.n:,} calls + {2 * args.n:,} outputs rows  {write_s:7.2f} s {rate(write_s)}")
    print(f"  judge the baseline arguments (1 thread)      {judge_s:7.2f} s {rate(judge_s)}  ({valid:,} valid)")
    print(f"  floor: read + write + judge / {cores}             {floor_s:7.2f} s {rate(floor_s)}  "
          f"(goal {GOAL:,} on a 2-core AVX2-only machine)")
    con.close()  # its tables hold both logs: let them go before the real run
    if args.compare:
        compare_s, counts = run_fast(b, c, work / "compare.duckdb")
        print(f"  toolaudit compare + store, end to end       {compare_s:7.2f} s {rate(compare_s)}  "
              f"({counts['drifted']:,} drifted; {compare_s / floor_s:.1f}x the floor)")


if __name__ == "__main__":
    main()
