"""Compare two recorded logs of the same requests (e.g. the nightly canary: target-only vs speculative).

The baseline log is read into a compact index (parsed outputs, not requests), then the candidate log is
streamed against it, so memory grows with the number of calls, not with the size of the prompts.
Calls are matched by (session, call index); a call in one log only is counted as unmatched, never as drift.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson

from toolaudit.analysis import Analyzer, SideOutput, message_raw_text
from toolaudit.schemas import SchemaRegistry
from toolaudit.store import RowBatch, Store
from toolaudit.toolcalls import parse_message
from toolaudit.traces import (DEFAULT_CUSTOMER_KEY, DEFAULT_SESSION_KEY, TraceCall, TraceLineError, TraceStats,
                              read_trace)

Progress = Callable[[int], None]  # called with the number of bytes just consumed


@dataclass
class CompareOptions:
    session_key: str = DEFAULT_SESSION_KEY
    customer_key: str = DEFAULT_CUSTOMER_KEY
    schema_dir: str | None = "schemas"
    run_name: str | None = None
    baseline_name: str = "baseline"
    candidate_name: str = "candidate"
    batch_rows: int = 20_000


@dataclass
class RunCounts:
    """Every input line lands in exactly one bucket: blank, error row, matched or unmatched call."""

    baseline: TraceStats = field(default_factory=TraceStats)
    candidate: TraceStats = field(default_factory=TraceStats)
    matched: int = 0
    baseline_only: int = 0
    candidate_only: int = 0
    drifted: int = 0
    kinds: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Indexed:
    """What the baseline index keeps per call: enough to diff, not the prompt."""

    customer: str | None
    tools_key: int
    output: SideOutput


def side_output(call: TraceCall, path_name: str) -> SideOutput:
    message = call.response_message
    return SideOutput(parsed=parse_message(message), raw=message_raw_text(message), path_name=path_name,
                      source=call.source, line=call.line,
                      system_fingerprint=(call.response or {}).get("system_fingerprint"))


class _ErrorSink:
    """Streams bad lines into trace_errors rows."""

    def __init__(self, run_id: int, side: str):
        self.run_id, self.side = run_id, side

    def add(self, batch: RowBatch, err: TraceLineError) -> None:
        batch.add("trace_errors", run_id=self.run_id, side=self.side, source=err.source, line=err.line,
                  field=err.field, message=err.message, excerpt=err.excerpt)


def compare_logs(store: Store, baseline_path: str | Path, candidate_path: str | Path,
                 options: CompareOptions | None = None, progress: Progress | None = None) -> tuple[int, RunCounts]:
    """Run a full comparison into `store`; returns (run_id, counts). Bad lines become error rows."""
    options = options or CompareOptions()
    run_id = store.create_run("compare", options.run_name, options.baseline_name, options.candidate_name,
                              str(baseline_path), str(candidate_path),
                              {"session_key": options.session_key, "customer_key": options.customer_key,
                               "schema_dir": options.schema_dir})
    counts = RunCounts()
    try:
        _compare(store, run_id, Path(baseline_path), Path(candidate_path), options, counts, progress)
    except BaseException:
        store.set_status(run_id, "interrupted")
        raise
    store.finish_run(run_id, counts.as_dict())
    return run_id, counts


def _compare(store: Store, run_id: int, baseline_path: Path, candidate_path: Path, options: CompareOptions,
             counts: RunCounts, progress: Progress | None) -> None:
    registry = SchemaRegistry(options.schema_dir)
    analyzer = Analyzer(run_id, registry)
    batch = RowBatch()
    tools_lists: dict[bytes, list] = {}  # interned tools lists: requests repeat the same few
    tools_by_id: list[list] = []

    def flush(force: bool = False) -> None:
        nonlocal batch
        if force or len(batch) >= options.batch_rows:
            analyzer.flush_issues(batch)
            store.write_batch(batch)
            batch = RowBatch()

    def intern_tools(call: TraceCall) -> int:
        tools = call.tools
        key = orjson.dumps(tools) if tools else b""
        idx = tools_lists.get(key)
        if idx is None:
            idx = tools_lists[key] = len(tools_by_id)
            tools_by_id.append(tools)
        return idx

    index: dict[tuple[str, int], _Indexed] = {}
    errors = _ErrorSink(run_id, "baseline")
    for item in read_trace(baseline_path, options.session_key, options.customer_key, stats=counts.baseline):
        if isinstance(item, TraceLineError):
            errors.add(batch, item)
            flush()
            continue
        index[item.key] = _Indexed(item.customer, intern_tools(item), side_output(item, options.baseline_name))
        if progress:
            progress(1)

    errors = _ErrorSink(run_id, "candidate")
    for item in read_trace(candidate_path, options.session_key, options.customer_key, stats=counts.candidate):
        if progress:
            progress(1)
        if isinstance(item, TraceLineError):
            errors.add(batch, item)
            flush()
            continue
        base = index.pop(item.key, None)
        candidate = side_output(item, options.candidate_name)
        if base is None:
            counts.candidate_only += 1
            analyzer.unmatched(batch, item.session_id, item.call_index, item.customer, "candidate", candidate)
        else:
            verdict = analyzer.pair(batch, item.session_id, item.call_index, base.customer or item.customer,
                                    tools_by_id[base.tools_key] or item.tools, base.output, candidate)
            counts.matched += 1
            counts.drifted += verdict.drifted
            counts.kinds[verdict.kind] = counts.kinds.get(verdict.kind, 0) + 1
        flush()

    for (session_id, call_index), base in index.items():
        counts.baseline_only += 1
        analyzer.unmatched(batch, session_id, call_index, base.customer, "baseline", base.output)
        flush()
    flush(force=True)
