"""Compare two recorded logs of the same requests (e.g. the nightly canary: target-only vs speculative).

In two steps. The scan (here): both files are opened as trace sources in their formats
(`toolaudit.ingest.sources`: an OpenAI log or an OTLP export scanned where it is, a format read whole held as
records) and read in chunks (by worker processes for big files) into compact digests (`scan`), which stream
into a DuckDB staging table (`store.staging`; an OTLP export's chunks once its ranges are settled), and call
indices are assigned there (a repeated key is an error row; calls pair by session and call index, or by request
digest when the session key cannot pair them: `pairing`), so memory stays flat however many calls an OpenAI
log holds. The join (`join`): pairs whose canonical tool calls agree (~99%) and calls in one log only (counted as
unmatched, never as drift) are written with INSERT ... SELECT straight from their digests; the rest are found
again in their source (a log line by byte offset, an export's call from its compact copy, a held record by
position) and diffed argument by argument in Python. Every row is written by `store.staging`: the agreeing
pairs' in SQL, the others from the buffer of `recorder`."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from toolaudit import ConfigError, TraceError
from toolaudit.compare.join import Join
from toolaudit.compare.pairing import Pairing, choose
from toolaudit.compare.pairs import Analyzer
from toolaudit.compare.recorder import Recorder
from toolaudit.compare.scan import ChunkResult, digest, settled, tools_key
from toolaudit.compare.scans import LocalScans, Scans
from toolaudit.ingest.formats.openai_lines import NO_SESSION
from toolaudit.ingest.gaps import CallGaps
from toolaudit.ingest.reading import check, open_source
from toolaudit.ingest.records import (
    CALL_INDEX_KEY,
    DEFAULT_CUSTOMER_KEY,
    DEFAULT_SESSION_KEY,
    TraceCall,
    TraceStats,
    collector_paused,
)
from toolaudit.ingest.shards import Shard
from toolaudit.ingest.sources import TraceSource, open_trace
from toolaudit.store import Store
from toolaudit.store.staging import Staging, staging
from toolaudit.validate.schemas import SchemaRegistry

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
    rows_per_write: int = 20_000  # rows built in Python per transaction (and differing pairs fetched at a time)
    workers: int | None = None  # None: one per core for big logs, in-process for small ones
    format: str | None = None  # a registered trace format for both files (toolaudit.ingest.registry); None: detect
    shard: Shard | None = None  # only this shard's sessions (see toolaudit.ingest.shards)
    memory_limit: str | None = "384MB"  # DuckDB's, while the digests are staged and joined (it spills past it)
    pair_by: str = "auto"  # "auto" | "session" | "request" (see compare.pairing)


@dataclass
class RunCounts:
    """Every input record lands in exactly one bucket: error row, skipped (not a model call), matched or
    unmatched call; `formats` says how each file was read, `skipped_reasons` why records were skipped."""

    baseline: TraceStats = field(default_factory=TraceStats)
    candidate: TraceStats = field(default_factory=TraceStats)
    matched: int = 0
    baseline_only: int = 0
    candidate_only: int = 0
    truncated: int = 0  # pairs with an answer cut at max_tokens: stored, not compared (compare.attribution)
    mismatched: int = 0  # pairs of different requests: stored, not compared
    drifted: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    mismatches: list[dict[str, Any]] = field(default_factory=list)  # the first few mismatched pairs, explained
    pairing: dict[str, str] = field(default_factory=dict)  # {by, reason}: how the calls were paired
    formats: dict[str, str] = field(default_factory=dict)
    skipped_reasons: dict[str, dict[str, int]] = field(default_factory=dict)
    # sharded runs only: {index, count, elsewhere: {side: records stored by other shards}}, so that per side
    # records = calls + errors + skipped + elsewhere
    shard: dict[str, Any] | None = None
    # what each side's calls lack (shown as warnings, not stored: a merge of shards sums counts only)
    gaps: dict[str, CallGaps] = field(default_factory=lambda: {"baseline": CallGaps(), "candidate": CallGaps()})

    def as_dict(self) -> dict:
        out = asdict(self)
        del out["gaps"]
        if out["shard"] is None:
            del out["shard"]
        return out


def compare_logs(store: Store, baseline_path: str | Path, candidate_path: str | Path,
                 options: CompareOptions | None = None, progress: Progress | None = None,
                 scans: Scans | None = None) -> tuple[int, RunCounts]:
    """Run a full comparison into `store`; returns (run_id, counts). Bad lines become error rows.
    `scans`: where the logs' ranges are scanned (`ray_scan.RayScans` for `--ray`); default: on this machine,
    with `options.workers` processes."""
    options = options or CompareOptions()
    scans = scans or LocalScans(options.workers)
    paths = [Path(baseline_path), Path(candidate_path)]
    for path in paths:  # fail before a run row exists for a file that cannot be read at all
        open_trace(path).close()
    with tempfile.TemporaryDirectory(prefix="toolaudit-") as tmp:
        # a file in a format read whole is read here (Langfuse joins records across lines)
        # calls without a session are kept: paired by request, or made error rows when pairing by session
        sources = [open_source(p, options.format, options.session_key, options.customer_key, sessionless=True)
                   for p in paths]
        counts = RunCounts(formats={"baseline": sources[0].fmt, "candidate": sources[1].fmt},
                           skipped_reasons={"baseline": sources[0].skipped, "candidate": sources[1].skipped})
        run_options: dict[str, Any] = {"session_key": options.session_key, "customer_key": options.customer_key,
                                       "schema_dir": options.schema_dir, "formats": counts.formats,
                                       "pair_by": options.pair_by}
        if options.shard is not None:
            run_options["shard"] = options.shard.as_dict()
            counts.shard = {**options.shard.as_dict(), "elsewhere": {"baseline": 0, "candidate": 0}}
        run_id = store.create_run("compare", options.run_name, options.baseline_name, options.candidate_name,
                                  str(baseline_path), str(candidate_path), run_options)
        comparison = _Comparison(store, run_id, sources, options, counts, progress, tmp, scans)
        try:
            try:
                comparison.run()
            finally:
                for src in sources:
                    src.close()
                sources.clear()
            store.finish_run(run_id, counts.as_dict())
        except BaseException:  # an error, Ctrl-C or SIGTERM (see cli/interrupts.py); the next writer rolls it back
            if comparison.measured_nothing:  # no run of 0 calls for `summary` to show as a result
                store.discard_run(run_id)
            else:
                store.mark_interrupted([run_id])
            raise
    return run_id, counts


class _Comparison:
    """The scan: streams chunk digests (baseline first, then candidate) into DuckDB staging tables, turns
    repeated keys into error rows, then hands the stage to the join (`join.Join`), re-reading lines for it."""

    def __init__(self, store: Store, run_id: int, sources: list[TraceSource], options: CompareOptions,
                 counts: RunCounts, progress: Progress | None, tmp: str, scans: Scans):
        self.store, self.run_id, self.sources, self.options = store, run_id, sources, options
        self.scans = scans
        self.tmp = tmp  # the workers' Parquet files of outputs columns
        self.paths = [Path(src.source) for src in sources]
        self.counts, self.progress = counts, progress
        self.measured_nothing = False  # set when a log held no usable call: the run is then discarded
        self.analyzer = Analyzer(run_id, SchemaRegistry(options.schema_dir))
        self.recorder = Recorder(run_id, options.rows_per_write)
        self.shard = options.shard
        self.other_calls = [0, 0]
        # a held source's position N is line shown[N-1] of the user's file (None: positions are lines)
        self.shown = [None if src.shown is None else pa.array(src.shown, pa.int64()) for src in sources]

    def run(self) -> None:
        workers = self.scans.workers(self.paths)
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
                self.recorder.error(side, err)
            for start, end in src.units(workers * 4 if workers > 1 else 1, CHUNK_BYTES):
                tasks.append((side, start, end, self.options.schema_dir, self.shard, side == 0, self.tmp))
                sides.append(side)
        line_base = [0, 0]
        waiting: list[list[ChunkResult]] = [[], []]  # a settling source's chunks, until all of them are in
        with staging(self.store, self.options.memory_limit) as stage:
            with collector_paused():  # chunk results pile up here (a settling source's notes): see collector_paused
                with self.scans.results(tasks, workers, self.sources) as results:
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
            self._pair_keys(stage)
            self._duplicates(stage)
            for side, found in stage.call_gaps(tools_key([])).items():
                self.counts.gaps["candidate" if side else "baseline"] = CallGaps(*found)
            self.recorder.flush(stage, force=True)
            self._require_calls()
            self._join(stage)

    def _require_calls(self) -> None:
        """Raise when a log held no usable call (a shard may hold none of a file's calls: the file as a whole
        must hold some), naming each such log: both, when neither can be compared."""
        problems = []
        for side, src in enumerate(self.sources):
            try:
                check(src, replace(self._stats(side), calls=self._stats(side).calls + self.other_calls[side]),
                      self.recorder.first_errors[side])
            except TraceError as exc:
                problems.append(exc)
        if not problems:
            return
        self.measured_nothing = True
        first, *others = problems
        also = [str(p) for p in others if str(p) != str(first)]  # the same file given twice: said once
        if not also:
            raise first
        raise TraceError(first.path, first.line, first.field, f"{first.message}; and {'; '.join(also)}")

    # -- per chunk --------------------------------------------------------------------------------------------
    def _absorb(self, stage: Staging, side: int, chunk: ChunkResult, base: int, size: int) -> None:
        """Fold one chunk (`size` bytes of a side's file) into the staging table; progress advances by bytes."""
        stats, src = self._stats(side), self.sources[side]
        if src.preset is None:
            stats.lines += chunk.stats.lines
            stats.blank += chunk.stats.blank
            stats.records += chunk.stats.records
        self.recorder.issues(chunk.schema_issues)
        if chunk.other_calls or chunk.other_errors:
            self.other_calls[side] += chunk.other_calls
            self._elsewhere(side, chunk.other_calls + chunk.other_errors)
        for err in chunk.errors:  # found while scanning: lines relative to the chunk
            stats.errors += 1
            self.recorder.error(side, replace(err, line=err.line + base))
        if chunk.table is not None and len(chunk.table):
            stats.calls += len(chunk.table)
            stage.append(side, chunk.table, base, chunk.lines, self.shown[side], chunk.outputs_file)
        self.recorder.flush(stage)
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
            self.recorder.error(side, err)
        rekeys = settlement.rekey or [{} for _ in chunks]
        for chunk, keep, rekey in zip(chunks, settlement.keep, rekeys):
            self._absorb(stage, side, settled(chunk, keep, rekey, self.shard), base, 0)
            base += chunk.lines
        chunks.clear()  # their notes: what re-reading needs is the source's now

    def _pair_keys(self, stage: Staging) -> None:
        """Pair by session or by request (`pairing.choose`); pairing by session, a call without a session is an
        error row, as in a sequential read."""
        key = self.options.session_key

        def mismatched() -> int:
            stage.index()
            return stage.mismatched_by_key()

        pairing: Pairing = choose(self.options.pair_by, stage.sessions(), key, mismatched)
        self.counts.pairing = pairing.as_dict()
        if pairing.by == "request":
            if self.shard is not None:
                raise ConfigError(f"pairing by request ({pairing.reason}) cannot be sharded: a shard holds whole "
                                  f"sessions; name a session key that separates sessions (--session-key), or "
                                  f"leave out --shard")
            stage.by_request()
            return
        for row in stage.take_sessionless():
            side = row["side"]
            stats = self._stats(side)
            stats.calls -= 1
            stats.errors += 1
            self.recorder.error(side, self.sources[side].error_at(
                row["offset"], row["shown"], key, NO_SESSION + ", or pair by request: --pair-by request"))

    def _duplicates(self, stage: Staging) -> None:
        """A second call with the same (session, call index) is an error row, as in a sequential read."""
        for dup in stage.index():
            side = dup["side"]
            stats = self._stats(side)
            stats.calls -= 1
            stats.errors += 1
            message = (f"duplicate call index {dup['call_index']} for session {dup['session_id']!r} "
                       f"(first seen at line {dup['first_shown']})")
            self.recorder.error(side, self.sources[side].error_at(dup["offset"], dup["shown"], CALL_INDEX_KEY, message))

    def _elsewhere(self, side: int, n: int) -> None:
        """Records of this file that other shards store (their sessions' calls, or bad lines for shard 1)."""
        if self.counts.shard is not None:
            self.counts.shard["elsewhere"]["candidate" if side else "baseline"] += n

    def _stats(self, side: int) -> TraceStats:
        return self.counts.baseline if side == 0 else self.counts.candidate

    # -- the join -----------------------------------------------------------------------------------------------
    def _join(self, stage: Staging) -> None:
        names = (self.options.baseline_name, self.options.candidate_name)
        joined = Join(stage, self.recorder, self.analyzer, names, max(1, self.options.rows_per_write)).run(
            self._call, self._check, (self.sources[0].source, self.sources[1].source))
        counts = self.counts
        for kind, n in joined.kinds.items():
            counts.kinds[kind] = counts.kinds.get(kind, 0) + n
        counts.matched += joined.matched
        counts.drifted += joined.drifted
        counts.baseline_only += joined.baseline_only
        counts.candidate_only += joined.candidate_only
        counts.truncated += joined.truncated
        counts.mismatched += joined.mismatched
        counts.mismatches.extend(joined.mismatches)

    def _check(self, line: int, offset: int) -> tuple[int, bool | None, str | None]:
        """The schema verdict of a candidate call scanned without validating."""
        d = digest(self.sources[1].reread(offset, line), offset, self.analyzer)
        return line, d.valid, d.schema_errors

    # -- re-reading -------------------------------------------------------------------------------------------
    def _call(self, side: int, line: int, offset: int, call_index: int) -> TraceCall:
        src = self.sources[side]
        item = src.reread(offset, line)
        return TraceCall(src.source, item.line, item.session_id, call_index, item.customer, item.request,
                         item.response, item.record)

