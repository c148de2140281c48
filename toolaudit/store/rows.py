"""The tables written in bulk: their column order and Arrow types, and the buffer that collects their rows until
the store writes them in one transaction."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson
import pyarrow as pa

from toolaudit.ingest import deepjson

# Column order and Arrow types of the tables written in bulk.
TABLE_COLUMNS: dict[str, dict[str, pa.DataType]] = {
    "calls": {
        "run_id": pa.int64(), "session_id": pa.string(), "call_index": pa.int32(), "customer": pa.string(),
        "tool_name": pa.string(), "match_status": pa.string(), "drift_kind": pa.string(),
        "drifted": pa.bool_(), "exact_text_match": pa.bool_(), "baseline_valid": pa.bool_(),
        "candidate_valid": pa.bool_(), "arg_diff_count": pa.int32(), "detail": pa.string(),
        "first_divergence": pa.int32(), "baseline_token": pa.string(), "candidate_token": pa.string(),
        "baseline_margin": pa.float64(), "candidate_margin": pa.float64(), "recorded_tool": pa.string(),
    },
    "outputs": {
        "run_id": pa.int64(), "session_id": pa.string(), "call_index": pa.int32(), "side": pa.string(),
        "path_name": pa.string(), "source": pa.string(), "line": pa.int32(), "text": pa.string(),
        "tool_calls": pa.string(), "parse_status": pa.string(), "parse_format": pa.string(),
        "parse_error": pa.string(), "schema_errors": pa.string(), "system_fingerprint": pa.string(),
        "token_ids": pa.list_(pa.int32()), "prompt_tokens": pa.int32(), "completion_tokens": pa.int32(),
        "latency_s": pa.float64(), "ttft_s": pa.float64(), "tokens_per_s": pa.float64(),
        "drafted_tokens": pa.int32(), "accepted_tokens": pa.int32(), "forward_passes": pa.int32(),
        "error": pa.string(), "finish_reason": pa.string(), "request_digest": pa.string(),
        "wall_share_s": pa.float64(),
    },
    "arg_diffs": {
        "run_id": pa.int64(), "session_id": pa.string(), "call_index": pa.int32(), "call_position": pa.int32(),
        "tool_name": pa.string(), "arg_path": pa.string(), "diff_kind": pa.string(),
        "baseline_value": pa.string(), "candidate_value": pa.string(),
    },
    "trace_errors": {
        "run_id": pa.int64(), "side": pa.string(), "source": pa.string(), "line": pa.int32(),
        "field": pa.string(), "message": pa.string(), "excerpt": pa.string(),
    },
    "replay_chunks": {
        "run_id": pa.int64(), "chunk_no": pa.int32(), "side": pa.string(), "path_name": pa.string(),
        "calls": pa.int32(), "wall_s": pa.float64(), "completion_tokens": pa.int64(), "drafted_tokens": pa.int64(),
        "accepted_tokens": pa.int64(), "forward_passes": pa.int64(), "errors": pa.int32(),
        "reused_prefill_s": pa.float64(),
    },
    "staged_results": {
        "run_id": pa.int64(), "session_id": pa.string(), "call_index": pa.int32(), "side": pa.string(),
        "path_name": pa.string(), "wall_share_s": pa.float64(), "result": pa.string(),
    },
    "probes": {
        "probe_id": pa.int64(), "created_at": pa.timestamp("us"), "run_id": pa.int64(), "side": pa.string(),
        "path_name": pa.string(), "engine": pa.string(), "config_fingerprint": pa.string(), "probe_set": pa.string(),
        "prompts": pa.int32(), "repeats": pa.int32(), "decisions": pa.string(), "numerics": pa.string(),
        "stable": pa.bool_(), "jitter_max": pa.float64(), "jitter_median": pa.float64(), "seconds": pa.float64(),
        "toolaudit_version": pa.string(), "engine_versions": pa.string(), "detail": pa.string(),
    },
    "samples": {
        "run_id": pa.int64(), "session_id": pa.string(), "call_index": pa.int32(), "side": pa.string(),
        "sample_index": pa.int32(), "path_name": pa.string(), "outcome": pa.string(), "outcome_kind": pa.string(),
        "tool_name": pa.string(), "arguments": pa.string(), "text": pa.string(), "completion_tokens": pa.int32(),
        "finish_reason": pa.string(), "error": pa.string(), "drafted_tokens": pa.int32(),
        "accepted_tokens": pa.int32(), "forward_passes": pa.int32(),
    },
    "sampled_calls": {
        "run_id": pa.int64(), "session_id": pa.string(), "call_index": pa.int32(), "customer": pa.string(),
        "tool_name": pa.string(), "n_baseline": pa.int32(), "n_candidate": pa.int32(), "outcomes": pa.int32(),
        "statistic": pa.float64(), "p_value": pa.float64(), "tv": pa.float64(), "tv_low": pa.float64(),
        "tv_high": pa.float64(),
    },
    "schema_issues": {
        "run_id": pa.int64(), "tool_name": pa.string(), "schema_source": pa.string(),
        "severity": pa.string(), "message": pa.string(),
    },
}


class RowBuffer:
    """Rows for several tables, given by column name, kept as tuples and turned into Arrow columns at write time.

    Columns a row leaves out are NULL; a name that is not a column of the table is an error (a typo must not
    silently drop a value). The transpose to columns happens once per write.
    """

    def __init__(self) -> None:
        self.rows: dict[str, list[tuple]] = {table: [] for table in TABLE_COLUMNS}
        self._order = {table: tuple(cols) for table, cols in TABLE_COLUMNS.items()}

    def add(self, table: str, **row: Any) -> None:
        order = self._order[table]
        if len(row) > len(order) or not row.keys() <= TABLE_COLUMNS[table].keys():
            unknown = sorted(set(row) - set(order))
            raise KeyError(f"{table} has no column(s) {', '.join(unknown)}")
        self.rows[table].append(tuple(map(row.get, order)))

    def __len__(self) -> int:
        return len(self.rows["calls"]) + len(self.rows["trace_errors"])

    def tables(self) -> Iterable[tuple[str, pa.Table]]:
        for table, rows in self.rows.items():
            if rows:
                types = TABLE_COLUMNS[table]
                columns = list(zip(*rows))
                arrays = [pa.array(col, type=typ) for col, typ in zip(columns, types.values())]
                yield table, pa.Table.from_arrays(arrays, names=list(types))


def json_text(value: Any) -> str | None:
    """Encode a JSON value for a JSON column; values JSON cannot hold are kept as their repr."""
    if value is None:
        return None
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # nesting past orjson's 254 levels, non-str keys, exotic values
        return deepjson.dumps(value, sort_keys=False)
