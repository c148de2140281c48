"""Compare two recorded logs of the same requests (e.g. the nightly canary: target-only vs speculative).

Both files are opened as trace sources in their formats (`toolaudit.ingest.sources`: an OpenAI log or an OTLP
export scanned where it is, a format read whole held as records) and scanned in chunks (by worker processes for
big files) into compact digests, which stream into a DuckDB staging table (an OTLP export's chunks once its
ranges are settled); call indices and the join by (session, call index) are computed there (`compare_sql`), so
memory stays flat however many calls an OpenAI log holds. Pairs whose canonical tool calls agree (~99%) and
calls in one log only (counted as unmatched, never as drift) are written with INSERT ... SELECT straight from
their digests; the rest are found again in their source (a log line by byte offset, an export's call from its
compact copy, a held record by position) and diffed argument by argument in Python.
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

import pyarrow as pa

from toolaudit.compare.pairs import Analyzer, SideOutput, message_raw_text
from toolaudit.compare.scan import ChunkResult, digest, hold, scan_task, settled, start_worker
from toolaudit.compare.staging import BASELINE_ONLY, CANDIDATE_ONLY, FAST, Staging, staging
from toolaudit.compare.vocabulary import DriftKind
from toolaudit.ingest.reading import check, open_source
from toolaudit.ingest.records import (
    CALL_INDEX_KEY,
    DEFAULT_CUSTOMER_KEY,
    DEFAULT_SESSION_KEY,
    TraceCall,
    TraceLineError,
    TraceStats,
    collector_paused,
)
from toolaudit.ingest.shards import Shard
from toolaudit.ingest.sources import TraceSource, open_trace
from toolaudit.store import RowBatch, Store
from toolaudit.validate.schemas import SchemaRegistry
from toolaudit.validate.toolcalls import parse_message

CHUNK_BYTES = 16 << 20  # one chunk's digests are a few MB: memory stays flat however big the logs are
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
    format: str | None = None  # a registered trace format for both files (toolaudit.ingest.registry); None: detect
    shard: Shard | None = None  # only this shard's sessions (see toolaudit.ingest.shards)
    memory_limit: str | None = "768MB"  # DuckDB's, while the digests are staged and joined (it spills past it)


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
        # a file in a format read whole is read here (Langfuse joins records across lines)
        sources = [open_source(p, options.format, options.session_key, options.customer_key) for p in paths]
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
            _Comparison(store, run_id, sources, options, counts, progress, tmp).run()
        except BaseException:
            store.set_status(run_id, "interrupted")
            raise
        finally:
            for src in sources:
                src.close()
            sources.clear()
    store.finish_run(run_id, counts.as_dict())
    return run_id, counts


class _Comparison:
    """Streams chunk digests (baseline first, then candidate) into DuckDB staging tables, joins them there, diffs
    the pairs that differ in Python and writes every other row with INSERT ... SELECT (see `compare_sql`)."""

    def __init__(self, store: Store, run_id: int, sources: list[TraceSource], options: CompareOptions,
                 counts: RunCounts, progress: Progress | None, tmp: str):
        self.store, self.run_id, self.sources, self.options = store, run_id, sources, options
        self.tmp = tmp  # the workers' Parquet files of outputs columns
        self.paths = [Path(src.source) for src in sources]
        self.counts, self.progress = counts, progress
        self.first_errors: list[list[TraceLineError]] = [[], []]
        self.analyzer = Analyzer(run_id, SchemaRegistry(options.schema_dir))
        self.batch = RowBatch()
        self.issues_seen: set[tuple] = set()
        self.shard = options.shard
        self.other_calls = [0, 0]
        # a held source's position N is line shown[N-1] of the user's file (None: positions are lines)
        self.shown = [None if src.shown is None else pa.array(src.shown, pa.int64()) for src in sources]

    def run(self) -> None:
        workers = self.options.workers or default_workers(self.paths)
        tasks, sides = [], []
        for side, src in enumerate(self.sources):
            stats = self._stats(side)
            if src.preset is not None:  # read whole: its own lines, records and skips, and its bad records
                for name in ("lines", "blank", "records", "skipped"):
                    setattr(stats, name, getattr(src.preset, name))
            for err in src.errors:
                if self.shard is not None and not self.shard.owns_unkeyed:
                    self._elsewhere(side, 1)
                    continue
                stats.errors += 1
                self._error(side, err)
            for start, end in src.units(workers * 4 if workers > 1 else 1, CHUNK_BYTES):
                tasks.append((side, start, end, self.options.schema_dir, self.shard, side == 0, self.tmp))
                sides.append(side)
        line_base = [0, 0]
        waiting: list[list[ChunkResult]] = [[], []]  # a settling source's chunks, until all of them are in
        with staging(self.store.con, self.options.memory_limit) as stage:
            with collector_paused():  # chunk results pile up here (a settling source's notes): see collector_paused
                with _results(tasks, workers, self.sources) as results:
                    for side, task, chunk in zip(sides, tasks, results):
                        size = self.sources[side].unit_bytes(*task[1:3])
                        if self.sources[side].settles:
                            waiting[side].append(chunk)
                            self._advance(size)
                            continue
                        self._absorb(stage, side, chunk, line_base[side], size)
                        line_base[side] += chunk.lines
                for side, chunks in enumerate(waiting):
                    if chunks:
                        self._settle(stage, side, chunks, line_base[side])
            self._duplicates(stage)
            self._flush(force=True)
            for side, src in enumerate(self.sources):
                # a shard may hold none of a file's calls: the file as a whole must hold some
                check(src, replace(self._stats(side), calls=self._stats(side).calls + self.other_calls[side]),
                      self.first_errors[side])
            self._pair(stage)

    # -- per chunk --------------------------------------------------------------------------------------------
    def _absorb(self, stage: Staging, side: int, chunk: ChunkResult, base: int, size: int) -> None:
        """Fold one chunk (`size` bytes of a side's file) into the staging table; progress advances by bytes."""
        stats, src = self._stats(side), self.sources[side]
        if src.preset is None:
            stats.lines += chunk.stats.lines
            stats.blank += chunk.stats.blank
            stats.records += chunk.stats.records
        for issue in chunk.schema_issues:
            self._issue(issue)
        if chunk.other_calls or chunk.other_errors:
            self.other_calls[side] += chunk.other_calls
            self._elsewhere(side, chunk.other_calls + chunk.other_errors)
        for err in chunk.errors:  # found while scanning: lines relative to the chunk
            stats.errors += 1
            self._error(side, replace(err, line=err.line + base))
        if chunk.table is not None and len(chunk.table):
            stats.calls += len(chunk.table)
            stage.append(side, chunk.table, base, chunk.lines, self.shown[side], chunk.outputs_file)
        self._flush()
        self._advance(size)

    def _advance(self, size: int) -> None:
        if self.progress and size:
            self.progress(size)

    def _settle(self, stage: Staging, side: int, chunks: list[ChunkResult], base: int) -> None:
        """A settling source's chunks, once all are in: its error rows and skips, then each chunk as settled."""
        src, stats = self.sources[side], self._stats(side)
        settlement = src.settle([chunk.notes for chunk in chunks])
        self.shown[side] = pa.array(src.shown, pa.int64())
        stats.skipped += sum(src.skipped.values())
        for err in settlement.errors:
            if self.shard is not None and not self.shard.owns_unkeyed:
                self._elsewhere(side, 1)
                continue
            stats.errors += 1
            self._error(side, err)
        for chunk, keep in zip(chunks, settlement.keep):
            self._absorb(stage, side, settled(chunk, keep), base, 0)
            base += chunk.lines
        chunks.clear()  # their notes: what re-reading needs is the source's now

    def _duplicates(self, stage: Staging) -> None:
        """A second call with the same (session, call index) is an error row, as in a sequential read."""
        for dup in stage.index():
            side = dup["side"]
            stats = self._stats(side)
            stats.calls -= 1
            stats.errors += 1
            message = (f"duplicate call index {dup['call_index']} for session {dup['session_id']!r} "
                       f"(first seen at line {dup['first_shown']})")
            self._error(side, self.sources[side].error_at(dup["offset"], dup["shown"], CALL_INDEX_KEY, message))

    def _elsewhere(self, side: int, n: int) -> None:
        """Records of this file that other shards store (their sessions' calls, or bad lines for shard 1)."""
        if self.counts.shard is not None:
            self.counts.shard["elsewhere"]["candidate" if side else "baseline"] += n

    def _stats(self, side: int) -> TraceStats:
        return self.counts.baseline if side == 0 else self.counts.candidate

    # -- the join -----------------------------------------------------------------------------------------------
    def _pair(self, stage: Staging) -> None:
        """Join the sides; diff the pairs that differ; validate the candidates that need it; write the rest."""
        how = stage.pair()
        page = max(1, self.options.batch_rows)
        for rows in stage.differing(page):
            for row in rows:
                self._candidate(row)
                self._flush()
        for rows in stage.candidates_to_check(page):
            stage.add_checked([self._check(row["line"], row["offset"]) for row in rows])
        for issue in self.analyzer.pending_issues:
            self._issue(issue)
        self.analyzer.pending_issues.clear()
        self._flush(force=True)
        names = (self.options.baseline_name, self.options.candidate_name)
        stage.write_rows(self.run_id, names, (self.sources[0].source, self.sources[1].source))
        for kind, n in stage.fast_kinds().items():
            self.counts.kinds[kind] = self.counts.kinds.get(kind, 0) + n
        self.counts.matched += how.get(FAST, 0)
        self.counts.baseline_only += how.get(BASELINE_ONLY, 0)
        self.counts.candidate_only += how.get(CANDIDATE_ONLY, 0)

    def _candidate(self, row: dict[str, Any]) -> None:
        """A matched pair whose canonical tool calls differ: re-read both lines and diff in full."""
        session_id, call_index = row["session_id"], row["call_index"]
        b_call = self._call(0, row["bl"], row["b_offset"], call_index)
        c_call = self._call(1, row["cl"], row["c_offset"], call_index)
        kind = DriftKind(self.analyzer.pair(self.batch, session_id, call_index, row["customer"], b_call.tools,
                                            side_output(b_call, self.options.baseline_name),
                                            side_output(c_call, self.options.candidate_name)).kind)
        for issue in self.analyzer.pending_issues:
            self._issue(issue)
        self.analyzer.pending_issues.clear()
        self.counts.matched += 1
        self.counts.drifted += kind.drifted
        self.counts.kinds[kind.value] = self.counts.kinds.get(kind.value, 0) + 1

    def _check(self, line: int, offset: int) -> tuple[int, bool | None, str | None]:
        """The schema verdict of a candidate call scanned without validating."""
        d = digest(self.sources[1].reread(offset, line), offset, self.analyzer)
        return line, d.valid, d.schema_errors

    # -- rows -------------------------------------------------------------------------------------------------
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
    def _call(self, side: int, line: int, offset: int, call_index: int) -> TraceCall:
        src = self.sources[side]
        item = src.reread(offset, line)
        return TraceCall(src.source, item.line, item.session_id, call_index, item.customer, item.request,
                         item.response, item.record)


@contextmanager
def _results(tasks: list[tuple], workers: int, sources: list[TraceSource]) -> Iterator[Iterator[ChunkResult]]:
    """Chunk results in task order: from a process pool (each worker given the sources once, as it starts: a
    forked worker inherits held records without copying them), or computed in-process for one worker."""
    if workers <= 1 or len(tasks) <= 2:
        hold(sources)
        try:
            yield (scan_task(t) for t in tasks)
        finally:
            hold([])
        return
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    with ctx.Pool(workers, initializer=start_worker, initargs=(sources,)) as pool:
        yield pool.imap(scan_task, tasks)
