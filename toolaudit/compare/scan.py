"""Scan a range of a trace source into compact per-call digests, in a worker process or in-process.

A digest holds what the comparison needs for the common case (the two answers agree): a hash of the canonical
signature of the tool calls, schema validity, and the row values to store. A chunk's digests travel as one Arrow
table (`DIGEST_COLUMNS`), which `store.staging` appends to a staging table; the rare pairs whose signatures differ
are found again by their key (a log line's byte offset, a held record's position: `TraceSource.reread`) and
diffed in full. Chunks carry positions relative to their start; the caller adds the positions of the chunks
before, so results equal a sequential read exactly. The sources reach worker processes once, when the pool
starts (`start_worker`): a fork inherits a whole-file source's records without copying them.

The candidate side is scanned without running its schemas (`validate=False`): an identical pair's candidate has
the baseline's verdict when both requests offer the same tools and the baseline's calls raised no schema error;
the join (`compare.join`) validates the few other candidates afterwards. Schema problems are still reported
from both sides.
"""

from __future__ import annotations

import gc
import hashlib
import os
import tempfile
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from toolaudit.compare.diff import call_signature
from toolaudit.compare.pairs import Analyzer, message_raw_text, tool_calls_json
from toolaudit.compare.request_digest import request_digest
from toolaudit.ingest.gaps import has_content
from toolaudit.ingest.records import (
    RawCall,
    TraceLineError,
    TraceStats,
    finish_reason,
    first_message,
    system_fingerprint,
)
from toolaudit.ingest.shards import Shard
from toolaudit.ingest.sources import Scanned, TraceSource
from toolaudit.validate.records import ToolCall
from toolaudit.validate.schemas import SchemaRegistry
from toolaudit.validate.toolcalls import parse_message


class Digest(NamedTuple):
    """One usable line of a log, reduced to what comparing and storing it needs."""

    line: int
    offset: int  # the call's key (a log line's byte offset), to re-read it when the pair needs a full diff
    session_id: str
    explicit_index: int | None
    customer: str | None
    signature: bytes  # hash of the canonical, order-independent encoding of all tool calls (signature_hash)
    simple: bool  # parsed cleanly (no unparseable output, no broken arguments): the fast path applies
    text: str  # assistant text outside tool calls, stripped
    status: str
    fmt: str
    error: str | None
    raw: str
    tool_calls: str | None  # JSON for the outputs table
    valid: bool | None
    schema_errors: str | None
    tool_name: str | None
    system_fingerprint: str | None
    tools_hash: bytes  # tools_key of the request's tools
    has_content: bool  # a message of the request says something (see ingest.gaps)
    finish_reason: str | None  # the recorded response's ("length": cut at max_tokens, see compare.attribution)
    request_digest: bytes  # SHA-256 of the canonical request (compare.request_digest): the same request?


# What the join needs of one scanned line (the caller adds side, absolute line and original line)...
DIGEST_COLUMNS: dict[str, pa.DataType] = {
    "line": pa.int64(), "offset": pa.int64(), "session_id": pa.string(), "explicit_index": pa.int64(),
    "customer": pa.string(), "sig": pa.binary(), "simple": pa.bool_(), "text_hash": pa.binary(),
    "raw_hash": pa.binary(), "status": pa.string(), "valid": pa.bool_(), "no_errors": pa.bool_(),
    "tool_name": pa.string(), "tools_hash": pa.binary(), "has_content": pa.bool_(), "finish_reason": pa.string(),
    "request_digest": pa.binary(),
}
# ... and what only its outputs row needs: written by the worker to a Parquet file per chunk, read back by DuckDB
# in the one INSERT ... SELECT that writes the outputs rows (so the bulk never passes through the parent).
OUTPUT_COLUMNS: dict[str, pa.DataType] = {
    "line": pa.int64(), "raw": pa.string(), "tool_calls": pa.string(), "fmt": pa.string(), "error": pa.string(),
    "schema_errors": pa.string(), "fingerprint": pa.string(),
}


def _hash(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


_EMPTY = _hash(b"")


@dataclass
class ChunkResult:
    table: pa.Table | None = None  # one row per digested call, DIGEST_COLUMNS
    outputs_file: str | None = None  # their OUTPUT_COLUMNS (None when the chunk digested no line)
    errors: list[TraceLineError] = field(default_factory=list)
    stats: TraceStats = field(default_factory=TraceStats)
    lines: int = 0  # positions in the range (a log's lines, blank ones included)
    schema_issues: list[dict] = field(default_factory=list)
    other_calls: int = 0  # calls of sessions in other shards (not digested)
    other_errors: int = 0  # bad lines left to shard 1 (they belong to no session)
    notes: Any = None  # a settling source's notes on the range (see `TraceSource.settles`)


class SchemaCache:
    """Compiled schemas per distinct tools list, looked up by the list's hash (`tools_key`) rather than by
    re-encoding the list for every call; and which (tools, tool name) schemas were already looked at."""

    def __init__(self, analyzer: Analyzer):
        self.analyzer = analyzer
        self.by_key: dict[bytes, dict] = {}
        self.noted: set[tuple[bytes, str]] = set()

    def schemas(self, key: bytes, tools: list) -> dict:
        found = self.by_key.get(key)
        if found is None:
            found = self.by_key[key] = self.analyzer.schemas_for(tools)
        return found

    def note(self, key: bytes, tools: list, calls: tuple[ToolCall, ...]) -> None:
        """Report the schemas' own problems (as validating would), without validating."""
        for call in calls:
            if (key, call.name) not in self.noted:
                self.noted.add((key, call.name))
                self.analyzer._schema(self.schemas(key, tools), call.name)


def _validity(cache: SchemaCache, key: bytes, tools: list, calls: tuple[ToolCall, ...],
              validate: bool = True) -> tuple[bool | None, str | None]:
    """All calls valid -> True, any invalid -> False, else None; plus the error messages as JSON.
    With validate=False only the schemas' own problems are reported (issues), and (None, None) returned."""
    if not calls:
        return None, None
    if not validate:
        cache.note(key, tools, calls)
        return None, None
    schemas = cache.schemas(key, tools)
    errors: list = []
    verdicts = [cache.analyzer.validate_call(schemas, call, errors) for call in calls]
    valid = False if False in verdicts else None if None in verdicts else True
    return valid, (orjson.dumps(errors).decode() if errors else None)


def signature_hash(calls: tuple[ToolCall, ...]) -> bytes:
    """A hash of the calls' canonical signatures, in a fixed order (the order of the calls does not matter)."""
    h = hashlib.blake2b(digest_size=16)
    for name, canon in sorted(call_signature(c) for c in calls):
        name_bytes = name.encode("utf-8", "surrogatepass")
        h.update(len(name_bytes).to_bytes(4, "big") + name_bytes + len(canon).to_bytes(8, "big"))
        h.update(canon)
    return h.digest()


def digest(item: RawCall, offset: int, analyzer: Analyzer | SchemaCache, validate: bool = True) -> Digest:
    """Parse, sign and validate one call's recorded answer."""
    cache = analyzer if isinstance(analyzer, SchemaCache) else SchemaCache(analyzer)
    response = item.response or {}
    message = first_message(response)
    parsed = parse_message(message)
    calls = parsed.calls
    simple = parsed.status != "unparseable" and not any(c.arguments_error for c in calls)
    tools = item.request.get("tools")
    tools = tools if isinstance(tools, list) else []
    key = tools_key(tools)
    valid, schema_errors = _validity(cache, key, tools, calls, validate)
    return Digest(item.line, offset, item.session_id, item.explicit_index, item.customer, signature_hash(calls),
                  simple, parsed.text.strip(), parsed.status, parsed.format, parsed.error, message_raw_text(message),
                  tool_calls_json(calls), valid, schema_errors, calls[0].name if calls else None,
                  system_fingerprint(response), key, has_content(item.request), finish_reason(response),
                  request_digest(item.request, key))


def tools_key(tools: list) -> bytes:
    """A hash of a request's tools list: equal lists, equal keys."""
    if not tools:
        return _hash(b"")
    try:
        return _hash(orjson.dumps(tools))
    except TypeError:  # nested past orjson's limit: still a stable key
        return _hash(repr(tools).encode("utf-8", "replace"))


_SOURCES: list[TraceSource] = []  # the comparison's sources, by side, in this process


def hold(sources: list[TraceSource]) -> None:
    """Make the comparison's sources the ones `scan_task` scans, in this process ([] to let them go)."""
    _SOURCES[:] = sources


def start_worker(sources: list[TraceSource]) -> None:
    """A pool worker's start: hold the sources, and take what it inherited out of the collector's passes
    (`gc.freeze`: the parent's held records are never garbage here, and walking them would copy every page)."""
    hold(sources)
    gc.freeze()
    gc.enable()


def scan_chunk(side: int, start: int, end: int, schema_dir: str | None, shard: Shard | None = None,
               validate: bool = True, out_dir: str | None = None) -> ChunkResult:
    """Digest every call in [start, end) of side `side`'s source. Positions are relative to the range (1-based).
    With a shard, only its sessions' calls are digested (and bad records only by shard 1); the rest are counted.
    validate=False leaves `valid`/`schema_errors` NULL (the candidate side: see the module docstring).
    The outputs columns go to a Parquet file in `out_dir` (default: the system's temporary folder)."""
    source = _SOURCES[side]
    result = ChunkResult()
    scanned = Scanned(result.stats)
    rows: list[tuple] = []
    outs: list[tuple] = []
    analyzer = Analyzer(0, SchemaRegistry(schema_dir))
    cache = SchemaCache(analyzer)
    for position, item in source.scan(start, end, scanned):
        if isinstance(item, TraceLineError):
            if shard is not None and not shard.owns_unkeyed:
                result.other_errors += 1
                continue
            result.stats.errors += 1
            result.errors.append(item)
        elif shard is not None and not item.inherits and not shard.holds(item.session_id):
            result.other_calls += 1
        else:
            d = digest(item, item.key, cache, validate)
            rows.append((position, d.offset, d.session_id, d.explicit_index, d.customer, d.signature, d.simple,
                         _text_hash(d.text), _text_hash(d.raw), d.status, d.valid, d.schema_errors is None,
                         d.tool_name, d.tools_hash, d.has_content, d.finish_reason, d.request_digest))
            outs.append((position, d.raw, d.tool_calls, d.fmt, d.error, d.schema_errors, d.system_fingerprint))
    result.table = _table(rows, DIGEST_COLUMNS)
    if outs:
        fd, result.outputs_file = tempfile.mkstemp(prefix=f"chunk-{side}-{start}-", suffix=".parquet", dir=out_dir)
        os.close(fd)
        pq.write_table(_table(outs, OUTPUT_COLUMNS), result.outputs_file, compression="lz4")
    result.lines = source.positions(start, end, scanned)
    result.notes = scanned.notes
    result.schema_issues = analyzer.pending_issues
    return result


def settled(chunk: ChunkResult, keep: dict[int, int], rekey: dict[int, tuple[str, str | None]] | None = None,
            shard: Shard | None = None) -> ChunkResult:
    """A settling source's chunk as settled: the rows of the calls that stay (`keep`: position -> call index),
    each given its call index and, where the source settled on another one (`rekey`: a span that inherits them
    from its parents), its session and customer; with a shard, only the rows of its sessions stay (a call whose
    session was not known when scanned was digested whatever its shard). The calls kept but not digested here
    belong to other shards."""
    table = chunk.table
    if table is not None and len(table):
        positions = table.column("line").to_pylist()
        if rekey:
            sessions = [rekey[p][0] if p in rekey else s for p, s in zip(positions,
                                                                        table.column("session_id").to_pylist())]
            customers = [rekey[p][1] if p in rekey else c for p, c in zip(positions,
                                                                         table.column("customer").to_pylist())]
            table = table.set_column(table.schema.get_field_index("session_id"), "session_id",
                                     pa.array(sessions, pa.string()))
            table = table.set_column(table.schema.get_field_index("customer"), "customer",
                                     pa.array(customers, pa.string()))
        else:
            sessions = table.column("session_id").to_pylist()
        stays = [p in keep and (shard is None or shard.holds(s)) for p, s in zip(positions, sessions)]
        kept = [p for p, stay in zip(positions, stays) if stay]
        if len(kept) < len(positions):
            table = table.filter(pa.array(stays))
        column = table.schema.get_field_index("explicit_index")
        table = table.set_column(column, "explicit_index", pa.array([keep[p] for p in kept], pa.int64()))
    rows = 0 if table is None else len(table)
    return replace(chunk, table=table, other_calls=len(keep) - rows, other_errors=0, errors=[])


def _text_hash(text: str) -> bytes:
    return _EMPTY if not text else _hash(text.encode("utf-8", "surrogatepass"))


def _table(rows: list[tuple], schema: dict[str, pa.DataType]) -> pa.Table:
    """Rows (in the schema's column order) as one Arrow table."""
    columns = list(zip(*rows)) if rows else [()] * len(schema)
    return pa.Table.from_arrays([pa.array(col, type=typ) for col, typ in zip(columns, schema.values())],
                                names=list(schema))


def scan_task(args: tuple) -> ChunkResult:
    """Pool entry point."""
    return scan_chunk(*args)
