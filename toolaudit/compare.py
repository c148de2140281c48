"""Compare two recorded logs of the same requests (e.g. the nightly canary: target-only vs speculative).

Both logs are scanned in chunks (by worker processes for big logs) into compact digests; the baseline's
digests form an index that the candidate's stream is joined against, so memory grows with the number of calls,
not with the size of the prompts. Pairs whose canonical tool calls agree (~99%) are stored straight from their
digests; the rest are re-read and diffed argument by argument. Calls are matched by (session, call index); a
call in one log only is counted as unmatched, never as drift.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from toolaudit.compare_scan import ChunkResult, Digest, scan_task, split_file
from toolaudit.errors import TraceError
from toolaudit.pairs import Analyzer, OutputRow, SideOutput, message_raw_text, write_call, write_output, write_unmatched
from toolaudit.records import DriftKind, MatchStatus
from toolaudit.schemas import SchemaRegistry
from toolaudit.shards import Shard
from toolaudit.store import RowBatch, Store
from toolaudit.toolcalls import parse_message
from toolaudit.traces import (
    CALL_INDEX_KEY,
    DEFAULT_CUSTOMER_KEY,
    DEFAULT_SESSION_KEY,
    CallIndexer,
    RawCall,
    TraceCall,
    TraceLineError,
    TraceSource,
    TraceStats,
    line_error,
    open_source,
    open_trace,
    parse_line,
)

Progress = Callable[[int], None]  # called with the number of input bytes just consumed (total: the files' sizes)


@dataclass
class CompareOptions:
    session_key: str = DEFAULT_SESSION_KEY
    customer_key: str = DEFAULT_CUSTOMER_KEY
    schema_dir: str | None = "schemas"
    run_name: str | None = None
    baseline_name: str = "baseline"
    candidate_name: str = "candidate"
    batch_rows: int = 20_000
    workers: int | None = None  # None: one per core for big logs, in-process for small ones
    format: str | None = None  # one of toolaudit.formats.FORMATS for both files; None: detect each file's
    shard: Shard | None = None  # only this shard's sessions (see toolaudit.shards)


@dataclass
class RunCounts:
    """Every input record lands in exactly one bucket: error row, skipped (not a model call), matched or
    unmatched call; `formats` says how each file was read, `skipped_reasons` why records were skipped."""

    baseline: TraceStats = field(default_factory=TraceStats)
    candidate: TraceStats = field(default_factory=TraceStats)
    matched: int = 0
    baseline_only: int = 0
    candidate_only: int = 0
    drifted: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    formats: dict[str, str] = field(default_factory=dict)
    skipped_reasons: dict[str, dict[str, int]] = field(default_factory=dict)
    # sharded runs only: {index, count, elsewhere: {side: records stored by other shards}}, so that per side
    # records = calls + errors + skipped + elsewhere
    shard: dict[str, Any] | None = None

    def as_dict(self) -> dict:
        out = asdict(self)
        if out["shard"] is None:
            del out["shard"]
        return out


def side_output(call: TraceCall, path_name: str) -> SideOutput:
    message = call.response_message
    return SideOutput(parsed=parse_message(message), raw=message_raw_text(message), path_name=path_name,
                      source=call.source, line=call.line,
                      system_fingerprint=(call.response or {}).get("system_fingerprint"))


def default_workers(paths: list[Path]) -> int:
    """Worker processes: one per core for big logs; in-process for small ones (no fork cost)."""
    total = sum(p.stat().st_size for p in paths if p.exists())
    return 1 if total < 64 * (1 << 20) else max(1, min(os.cpu_count() or 1, 8))


def compare_logs(store: Store, baseline_path: str | Path, candidate_path: str | Path,
                 options: CompareOptions | None = None, progress: Progress | None = None) -> tuple[int, RunCounts]:
    """Run a full comparison into `store`; returns (run_id, counts). Bad lines become error rows."""
    options = options or CompareOptions()
    paths = [Path(baseline_path), Path(candidate_path)]
    for path in paths:  # fail before a run row exists for a file that cannot be read at all
        open_trace(path).close()
    with tempfile.TemporaryDirectory(prefix="toolaudit-") as tmp:
        # files in another format are converted first (spans arrive unordered: a call needs the whole file)
        sources = [open_source(p, options.format, options.session_key, options.customer_key, tmp) for p in paths]
        counts = RunCounts(formats={"baseline": sources[0].fmt, "candidate": sources[1].fmt},
                           skipped_reasons={"baseline": sources[0].skipped, "candidate": sources[1].skipped})
        run_options: dict[str, Any] = {"session_key": options.session_key, "customer_key": options.customer_key,
                                       "schema_dir": options.schema_dir, "formats": counts.formats}
        if options.shard is not None:
            run_options["shard"] = options.shard.as_dict()
            counts.shard = {**options.shard.as_dict(), "elsewhere": {"baseline": 0, "candidate": 0}}
        run_id = store.create_run("compare", options.run_name, options.baseline_name, options.candidate_name,
                                  str(baseline_path), str(candidate_path), run_options)
        try:
            _Comparison(store, run_id, sources, options, counts, progress).run()
        except BaseException:
            store.set_status(run_id, "interrupted")
            raise
    store.finish_run(run_id, counts.as_dict())
    return run_id, counts


class _Comparison:
    """Streams chunk digests (baseline first, then candidate) into a join and writes rows in batches."""

    def __init__(self, store: Store, run_id: int, sources: list[TraceSource], options: CompareOptions,
                 counts: RunCounts, progress: Progress | None):
        self.store, self.run_id, self.sources, self.options = store, run_id, sources, options
        self.paths = [Path(src.path) for src in sources]  # what is scanned: the file, or its OpenAI-shaped copy
        self.counts, self.progress = counts, progress
        self.first_errors: list[list[TraceLineError]] = [[], []]
        # progress counts the user's bytes: a converted side's scanned bytes are scaled to its file's size
        self.scale = [os.path.getsize(s.source) / max(1, os.path.getsize(s.path)) for s in sources]
        self.analyzer = Analyzer(run_id, SchemaRegistry(options.schema_dir))
        self.batch = RowBatch()
        self.issues_seen: set[tuple] = set()
        self.index: dict[tuple[str, int], Digest] = {}
        self.handles: dict[int, Any] = {}
        self.shard = options.shard
        self.other_calls = [0, 0]

    def run(self) -> None:
        workers = self.options.workers or default_workers(self.paths)
        tasks, sides = [], []
        for side, (path, src) in enumerate(zip(self.paths, self.sources)):
            stats = self._stats(side)
            if src.preset is not None:  # a converted file: its own lines, records and skips, and its bad records
                for name in ("lines", "blank", "records", "skipped"):
                    setattr(stats, name, getattr(src.preset, name))
                for err in src.errors:
                    if self.shard is not None and not self.shard.owns_unkeyed:
                        self._elsewhere(side, 1)
                        continue
                    stats.errors += 1
                    self._error(side, err)
            for start, end in split_file(str(path), workers * 4 if workers > 1 else 1):
                tasks.append((str(path), start, end, src.session_key, src.customer_key, self.options.schema_dir,
                              self.shard))
                sides.append(side)
        line_base = [0, 0]
        indexers = [CallIndexer(), CallIndexer()]
        try:
            with _results(tasks, workers) as results:
                for side, task, chunk in zip(sides, tasks, results):
                    self._absorb(side, chunk, line_base[side], indexers[side], task[1], task[2])
                    line_base[side] += chunk.lines
            for side, src in enumerate(self.sources):
                try:  # a shard may hold none of a file's calls: the file as a whole must hold some
                    src.check(replace(self._stats(side), calls=self._stats(side).calls + self.other_calls[side]),
                              self.first_errors[side])
                except TraceError:
                    self._flush(force=True)  # keep the error rows: `toolaudit sql` shows them all
                    raise
            for (session_id, call_index), base in self.index.items():
                self.counts.baseline_only += 1
                self._unmatched(session_id, call_index, base, "baseline")
                self._flush()
            self._flush(force=True)
        finally:
            for handle in self.handles.values():
                handle.close()

    # -- per chunk --------------------------------------------------------------------------------------------
    def _absorb(self, side: int, chunk: ChunkResult, base: int, indexer: CallIndexer, start: int, end: int) -> None:
        """Fold one chunk (bytes start..end of a side's file) into the join; progress advances by bytes."""
        stats, src = self._stats(side), self.sources[side]
        if not src.converted:
            stats.lines += chunk.stats.lines
            stats.blank += chunk.stats.blank
            stats.records += chunk.stats.lines - chunk.stats.blank
        for issue in chunk.schema_issues:
            self._issue(issue)
        if chunk.other_calls or chunk.other_errors:
            self.other_calls[side] += chunk.other_calls
            self._elsewhere(side, chunk.other_calls + chunk.other_errors)
        for err in chunk.errors:
            stats.errors += 1
            self._error(side, src.translate(replace(err, line=err.line + base)))
        for d in chunk.digests:
            line = d.line + base
            index = indexer.assign(d.session_id, d.explicit_index, src.where(line)[1])
            if isinstance(index, str):
                stats.errors += 1
                raw = self._reread(side, d.offset)
                self._error(side, src.translate(line_error(raw, str(self.paths[side]), line, CALL_INDEX_KEY, index)))
                continue
            stats.calls += 1
            d = d._replace(line=line)
            if side == 0:
                self.index[(d.session_id, index)] = d
            else:
                self._candidate(d, index)
            if self.progress:
                self.progress(round((d.offset - start) * self.scale[side]))
                start = d.offset
            self._flush()
        if self.progress:
            self.progress(round((end - start) * self.scale[side]))

    def _elsewhere(self, side: int, n: int) -> None:
        """Records of this file that other shards store (their sessions' calls, or bad lines for shard 1)."""
        if self.counts.shard is not None:
            self.counts.shard["elsewhere"]["candidate" if side else "baseline"] += n

    def _stats(self, side: int) -> TraceStats:
        return self.counts.baseline if side == 0 else self.counts.candidate

    def _candidate(self, cand: Digest, call_index: int) -> None:
        base = self.index.pop((cand.session_id, call_index), None)
        if base is None:
            self.counts.candidate_only += 1
            self._unmatched(cand.session_id, call_index, cand, "candidate")
            return
        customer = base.customer or cand.customer
        if base.simple and cand.simple and base.status == cand.status and base.signature == cand.signature:
            kind = DriftKind.IDENTICAL if base.text == cand.text else DriftKind.TEXT_ONLY
            write_call(self.batch, self.run_id, cand.session_id, call_index, MatchStatus.MATCHED, customer=customer,
                       tool_name=base.tool_name or cand.tool_name, kind=kind, exact_text_match=base.raw == cand.raw,
                       baseline_valid=base.valid, candidate_valid=cand.valid, arg_diff_count=0)
            write_output(self.batch, self.run_id, cand.session_id, call_index, "baseline", self._row(0, base))
            write_output(self.batch, self.run_id, cand.session_id, call_index, "candidate", self._row(1, cand))
        else:  # the rare pair that differs: re-read both lines and diff in full
            b_call, c_call = self._call(0, base, call_index), self._call(1, cand, call_index)
            kind = DriftKind(self.analyzer.pair(self.batch, cand.session_id, call_index, customer, b_call.tools,
                                                side_output(b_call, self.options.baseline_name),
                                                side_output(c_call, self.options.candidate_name)).kind)
            for issue in self.analyzer.pending_issues:
                self._issue(issue)
            self.analyzer.pending_issues.clear()
        self.counts.matched += 1
        self.counts.drifted += kind.drifted
        self.counts.kinds[kind.value] = self.counts.kinds.get(kind.value, 0) + 1

    # -- rows -------------------------------------------------------------------------------------------------
    def _row(self, side: int, d: Digest) -> OutputRow:
        source, line = self.sources[side].where(d.line)
        return OutputRow(self.options.baseline_name if side == 0 else self.options.candidate_name, d.raw,
                         d.tool_calls, d.status, d.fmt, d.error, source, line, d.schema_errors,
                         d.system_fingerprint)

    def _unmatched(self, session_id: str, call_index: int, d: Digest, side: str) -> None:
        write_unmatched(self.batch, self.run_id, session_id, call_index, side, d.customer, d.tool_name,
                        self._row(0 if side == "baseline" else 1, d))

    def _issue(self, issue: dict) -> None:
        """Schema issues arrive from every chunk: store each once per run."""
        key = tuple(issue.values())
        if key not in self.issues_seen:
            self.issues_seen.add(key)
            self.batch.add("schema_issues", run_id=self.run_id, **issue)

    def _error(self, side: int, err: TraceLineError) -> None:
        if len(self.first_errors[side]) < 3:
            self.first_errors[side].append(err)
        self.batch.add("trace_errors", run_id=self.run_id, side="baseline" if side == 0 else "candidate",
                       source=err.source, line=err.line, field=err.field, message=err.message, excerpt=err.excerpt)

    def _flush(self, force: bool = False) -> None:
        if force or len(self.batch) >= self.options.batch_rows:
            self.store.write_batch(self.batch)
            self.batch = RowBatch()

    # -- re-reading -------------------------------------------------------------------------------------------
    def _reread(self, side: int, offset: int) -> bytes:
        handle = self.handles.get(side)
        if handle is None:
            handle = self.handles[side] = open(self.paths[side], "rb")
        handle.seek(offset)
        return handle.readline()

    def _call(self, side: int, d: Digest, call_index: int) -> TraceCall:
        src = self.sources[side]
        item = parse_line(self._reread(side, d.offset), str(self.paths[side]), d.line, src.session_key,
                          src.customer_key, True)
        assert isinstance(item, RawCall), "a line that digested cleanly parses again"
        source, line = src.where(d.line)
        return TraceCall(source, line, item.session_id, call_index, item.customer, item.request, item.response)


@contextmanager
def _results(tasks: list[tuple], workers: int) -> Iterator[Iterator[ChunkResult]]:
    """Chunk results in task order: from a process pool, or computed in-process for one worker."""
    if workers <= 1 or len(tasks) <= 2:
        yield (scan_task(t) for t in tasks)
        return
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    with ctx.Pool(workers) as pool:
        yield pool.imap(scan_task, tasks)
