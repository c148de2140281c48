"""The DuckDB store: one file holds runs, calls, both paths' outputs, argument diffs and the reporting views.

`db` opens it (migrations applied on open) and owns every transaction; `rows` defines the bulk-written tables;
`migrations` and `views` define the schema; `queries` holds the named read queries that figures, the gate and
reports use. No other module writes SQL, except the user's own `toolaudit sql`.
"""

from toolaudit.store.db import Store
from toolaudit.store.rows import TABLE_COLUMNS, RowBuffer, json_text

__all__ = ["Store", "RowBuffer", "TABLE_COLUMNS", "json_text"]
