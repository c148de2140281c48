"""The SQL of `toolaudit export`: every table and view (or one run's rows of them) copied to Parquet or CSV
files with DuckDB's `COPY ... TO`, one file per table or view, for warehouse loads."""

from __future__ import annotations

from pathlib import Path

from toolaudit.store.db import Store

FORMATS = ("parquet", "csv")


def _quote(path: str) -> str:
    return "'" + path.replace("'", "''") + "'"


def relations(store: Store) -> list[tuple[str, bool]]:
    """(name, has a run_id column) of every table and view, tables first."""
    rows = store.query("""
        SELECT t.table_name, bool_or(c.column_name = 'run_id')
        FROM information_schema.tables t JOIN information_schema.columns c
          ON c.table_schema = t.table_schema AND c.table_name = t.table_name
        WHERE t.table_schema = 'main' AND t.table_catalog = current_database()
          AND c.table_catalog = current_database()
        GROUP BY t.table_name, t.table_type ORDER BY t.table_type, t.table_name""")[1]
    return [(name, bool(has_run)) for name, has_run in rows]


def export_relations(store: Store, out_dir: str | Path, fmt: str, run_id: int | None = None) -> list[tuple[str, int]]:
    """Write `<out_dir>/<name>.<fmt>` for every table and view; with `run_id`, only that run's rows (tables
    without a run column, i.e. `schema_migrations`, whole). Returns (file, rows) per file written."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    options = "FORMAT parquet, COMPRESSION zstd" if fmt == "parquet" else "FORMAT csv, HEADER true"
    written = []
    for name, has_run in relations(store):
        where = f" WHERE run_id = {int(run_id)}" if run_id is not None and has_run else ""
        target = out / f"{name}.{fmt}"
        rows = store.con.execute(f'COPY (SELECT * FROM "{name}"{where}) TO {_quote(str(target))} ({options})'
                                 ).fetchall()[0][0]
        written.append((str(target), rows))
    return written
