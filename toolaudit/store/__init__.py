"""The DuckDB store: one file holds runs, calls, both paths' outputs, argument diffs and the reporting views.

It owns every SQL statement and every transaction, except the user's own `toolaudit sql`:
- `db`: the `Store` (opens the file, applies migrations, opens every transaction, writes buffered rows, run and
  replay bookkeeping); `files`: what a --db path must be before DuckDB opens it; `rows`: the bulk-written
  tables' columns and the `RowBuffer` that collects their rows;
- `migrations` and `views`: the schema;
- `queries`: the named read queries behind figures, the gate and `runs`; `report_queries`: those of a
  customer's report (each filtered to that customer's calls); `history`: the runs over time and their probes;
- `staging`: `compare`'s staging tables (digests joined in SQL) and the one writer of a compare run's rows;
- `batch`: the staging of `toolaudit batch import`; `merge` and `combine`: `toolaudit merge`; `export`:
  `toolaudit export`; `snapshot`: the copy a replay or compare publishes for readers while it holds the file;
  `recovery`: a writer opening the file settles the runs a dead process left `running`.
A layout test fails on SQL text outside this package.
"""

from toolaudit.store.db import Store
from toolaudit.store.rows import TABLE_COLUMNS, RowBuffer, json_text

__all__ = ["Store", "RowBuffer", "TABLE_COLUMNS", "json_text"]
