"""Teacher-forced replay: each recorded call, with its recorded context, through two decode paths.

Resumable by construction: every batch of calls is written (calls, both outputs, argument diffs, timings) in
one transaction, and a resumed run skips the calls already stored. A kill at any point loses at most the batch
in flight, which the resume redoes; nothing is stored twice. Calls whose engine failed are stored as error
rows and retried on resume.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from toolaudit.engines import ENGINES, Engine, EngineRequest, EngineResult, make_engine
from toolaudit.engines.paths import PathConfig, load_paths
from toolaudit.engines.torch.config import NUMERICS
from toolaudit.errors import ConfigError, StoreError
from toolaudit.fingerprint import fingerprint
from toolaudit.pairs import Analyzer, Divergence, SideOutput, message_raw_text, write_call, write_output
from toolaudit.records import MatchStatus
from toolaudit.schemas import SchemaRegistry
from toolaudit.shards import shard_from_options
from toolaudit.store import RowBatch, Store
from toolaudit.toolcalls import parse_message, parse_text
from toolaudit.traces import (
    DEFAULT_CUSTOMER_KEY,
    DEFAULT_SESSION_KEY,
    TraceCall,
    TraceLineError,
    TraceStats,
    read_trace,
)

Progress = Callable[[int], None]


@dataclass
class ReplayOptions:
    traces: list[str]
    baseline: str = "target"
    candidate: str = "spec-ngram"
    paths_file: str | None = None
    limit: int | None = None
    run_name: str | None = None
    session_key: str = DEFAULT_SESSION_KEY
    customer_key: str = DEFAULT_CUSTOMER_KEY
    schema_dir: str | None = "schemas"
    # Calls handed to each engine per transaction. Larger than batch_size so continuous batching keeps its
    # slots full; a kill loses at most one chunk, which resume redoes.
    chunk: int = 64
    # None: path-major when an engine cannot be held beside another (see Replayer.path_major); True/False force.
    path_major: bool | None = None
    # Overrides the `numerics` key of every torch path ("auto" | "native" | "emulated"), e.g. for the demo.
    numerics: str | None = None
    # Trace format (see `toolaudit.formats`); None detects it from each file's first record. Kept for --resume.
    trace_format: str | None = None
    # Replay only the first K calls of each session: a sample that keeps every session (and customer) in.
    calls_per_session: int | None = None
    # Only the sessions of one shard ({"index": K, "count": N}, see toolaudit.shards), after `limit`.
    shard: dict[str, int] | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class ReplayCounts:
    traces: dict[str, dict] = field(default_factory=dict)
    calls: int = 0  # usable calls selected (after --limit)
    replayed: int = 0  # done in this invocation
    skipped: int = 0  # already stored by an earlier invocation (resume)
    errors: int = 0  # calls whose engine failed on either path


def load_calls(options: ReplayOptions) -> tuple[list[TraceCall], list[TraceLineError], dict[str, dict]]:
    """All usable calls of the trace files (first `limit`), the bad lines, and per-file accounting."""
    calls: list[TraceCall] = []
    errors: list[TraceLineError] = []
    stats: dict[str, dict] = {}
    for path in options.traces:
        st = TraceStats()
        for item in read_trace(path, options.session_key, options.customer_key, require_response=False, stats=st,
                               fmt=options.trace_format):
            (errors if isinstance(item, TraceLineError) else calls).append(item)
        stats[str(path)] = st.__dict__
    if options.calls_per_session is not None:
        seen: dict[str, int] = {}
        kept = []
        for call in calls:
            seen[call.session_id] = seen.get(call.session_id, 0) + 1
            if seen[call.session_id] <= options.calls_per_session:
                kept.append(call)
        calls = kept
    if options.limit is not None:
        calls = calls[: options.limit]
    shard = shard_from_options({"shard": options.shard})
    if shard is not None:  # whole sessions; input error rows belong to no session and are shard 1's
        calls = [c for c in calls if shard.holds(c.session_id)]
        errors = errors if shard.owns_unkeyed else []
    return calls, errors, stats


def resolve_paths(options: ReplayOptions) -> tuple[PathConfig, PathConfig]:
    paths = load_paths(options.paths_file)
    for name in (options.baseline, options.candidate):
        if name not in paths:
            where = options.paths_file or "the built-in paths"
            raise ConfigError(f"unknown decode path {name!r} (known in {where}: {', '.join(sorted(paths))})")
    chosen = paths[options.baseline], paths[options.candidate]
    if options.numerics is not None:
        if options.numerics not in NUMERICS:
            raise ConfigError(f"numerics must be one of {', '.join(NUMERICS)} (got {options.numerics!r})")
        chosen = tuple(replace(p, options={**p.options, "numerics": options.numerics}) if p.engine == "torch"
                       else p for p in chosen)
    return chosen


def side_output(result: EngineResult, path: PathConfig, wall_share: float) -> SideOutput:
    """An engine result as the analysis sees it, with its decode evidence for the outputs table."""
    if result.message is not None:
        parsed, raw = parse_message(result.message), message_raw_text(result.message)
    else:
        parsed, raw = parse_text(result.text), result.text
    evidence = {
        "token_ids": result.token_ids or None, "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens, "latency_s": result.latency_s, "ttft_s": result.ttft_s,
        "tokens_per_s": result.completion_tokens / wall_share if wall_share > 0 else None,
        "drafted_tokens": result.drafted_tokens, "accepted_tokens": result.accepted_tokens,
        "forward_passes": result.forward_passes, "error": result.error,
    }
    return SideOutput(parsed, raw, path.name, system_fingerprint=result.system_fingerprint, extra=evidence)


def first_divergence(base: EngineResult, cand: EngineResult,
                     decode: Callable[[list[int]], str] | None) -> Divergence | None:
    """The first differing generated token (position, both tokens, both top-2 margins), or None when the token
    streams agree or either side has no token evidence.

    Token ids are compared when both sides have them; otherwise the token strings (`EngineResult.tokens`, e.g.
    from an HTTP endpoint's logprobs) when both sides have those."""
    a: list = base.token_ids
    b: list = cand.token_ids
    by_text = not a or not b
    if by_text:
        a, b = base.tokens, cand.tokens
    if not a or not b or a == b:
        return None
    n = min(len(a), len(b))
    pos = next((i for i in range(n) if a[i] != b[i]), n)

    def token(seq: list) -> str | None:
        if pos >= len(seq):
            return None
        if by_text:
            return seq[pos]
        return decode([seq[pos]]) if decode else str(seq[pos])

    def margin(result: EngineResult) -> float | None:
        return float(result.margins[pos]) if pos < len(result.margins) else None

    return Divergence(pos, token(a), token(b), margin(base), margin(cand))


class Replayer:
    """Drives one replay run into the store; `run()` is safe to call again on the same run id."""

    def __init__(self, store: Store, options: ReplayOptions,
                 engine_factory: Callable[[PathConfig], Engine] = make_engine):
        self.store, self.options = store, options
        self.baseline_path, self.candidate_path = resolve_paths(options)
        self.engine_factory = engine_factory
        self._engines: dict[str, Engine] = {}
        self._next_batch: int | None = None

    def engine(self, path: PathConfig) -> Engine:
        if path.name not in self._engines:
            self._engines[path.name] = self.engine_factory(path)
        return self._engines[path.name]

    def create_run(self) -> int:
        components = {side: self.engine(p).fingerprint_components()
                      for side, p in (("baseline", self.baseline_path), ("candidate", self.candidate_path))}
        options = self.options.as_dict() | {
            "baseline_config": self.baseline_path.config_dict(),
            "candidate_config": self.candidate_path.config_dict(),
            "baseline_fingerprint_components": components["baseline"],
            "candidate_fingerprint_components": components["candidate"],
            "noise_floor": _same_decoding(self.baseline_path, self.candidate_path),
        }
        return self.store.create_run(
            "replay", self.options.run_name, self.baseline_path.name, self.candidate_path.name,
            _describe(self.baseline_path), _describe(self.candidate_path), options,
            fingerprint(components["baseline"]), fingerprint(components["candidate"]))

    def path_major(self) -> bool:
        """Run one path over the whole selection, release it, then the other: for engines that must not be
        held together (vLLM's workers spin and starve each other on a small CPU, and split GPU memory)."""
        if self.options.path_major is not None:
            return self.options.path_major
        return not all(ENGINES[p.engine].holds_together for p in (self.baseline_path, self.candidate_path)
                       if p.engine in ENGINES)

    def run(self, run_id: int, progress: Progress | None = None, on_total: Callable[[int], None] | None = None
            ) -> ReplayCounts:
        self.store.set_status(run_id, "running")
        try:
            calls, bad_lines, stats = load_calls(self.options)
            counts = ReplayCounts(traces=stats, calls=len(calls))
            self._write_trace_errors(run_id, bad_lines)
            done = self.store.stored_call_keys(run_id)
            todo = [c for c in calls if c.key not in done]
            counts.skipped = len(calls) - len(todo)
            analyzer = Analyzer(run_id, SchemaRegistry(self.options.schema_dir))
            size = max(self.options.chunk, self.baseline_path.batch_size, self.candidate_path.batch_size)
            chunks = [todo[i:i + size] for i in range(0, len(todo), size)]
            if self.path_major():
                staged = self.store.staged_keys(run_id, "baseline")
                first = [c for c in todo if c.key not in staged]
                if on_total:
                    on_total(len(first) + len(todo))
                for chunk in (first[i:i + size] for i in range(0, len(first), size)):
                    self._stage_chunk(run_id, chunk)
                    if progress:
                        progress(len(chunk))
                self._release(self.baseline_path)
                for chunk in chunks:
                    counts.errors += self._pair_staged_chunk(run_id, chunk, analyzer)
                    counts.replayed += len(chunk)
                    if progress:
                        progress(len(chunk))
            else:
                if on_total:
                    on_total(len(todo))
                for chunk in chunks:
                    counts.errors += self._replay_chunk(run_id, chunk, analyzer)
                    counts.replayed += len(chunk)
                    if progress:
                        progress(len(chunk))
        except BaseException:
            self.store.set_status(run_id, "interrupted")
            raise
        finally:  # free models and engine processes (vLLM workers spin while idle) as soon as the run ends
            for path in (self.baseline_path, self.candidate_path):
                self._release(path)
        shard = {"shard": self.options.shard} if self.options.shard else {}
        self.store.finish_run(run_id, {"replay": counts.__dict__, "baseline": _sum_stats(stats),
                                       "candidate": _sum_stats(stats), **shard})
        return counts

    # -- internals ----------------------------------------------------------------------------------------
    def _generate(self, run_id: int, batch_no: int, side: str, path: PathConfig, chunk: list[TraceCall],
                  batch: RowBatch) -> tuple[list[EngineResult], float]:
        """One engine call for a chunk; its timings become a `replay_batches` row of the same transaction."""
        requests = [EngineRequest(f"{c.session_id}\x1f{c.call_index}", c.request.get("messages") or [],
                                  c.tools) for c in chunk]
        t0 = time.perf_counter()
        out = self.engine(path).generate(requests)
        wall = time.perf_counter() - t0
        if len(out) != len(requests):
            raise StoreError(f"engine for path {path.name!r} returned {len(out)} results for "
                             f"{len(requests)} requests")
        batch.add("replay_batches", run_id=run_id, batch_no=batch_no, side=side,
                  path_name=path.name, calls=len(out), wall_s=wall,
                  completion_tokens=sum(r.completion_tokens for r in out),
                  drafted_tokens=sum(r.drafted_tokens for r in out),
                  accepted_tokens=sum(r.accepted_tokens for r in out),
                  forward_passes=sum(r.forward_passes for r in out), errors=sum(1 for r in out if r.error))
        return out, wall

    def _batch_no(self, run_id: int) -> int:
        if self._next_batch is None:
            self._next_batch = self.store.next_batch_no(run_id)
        self._next_batch += 1
        return self._next_batch - 1

    def _replay_chunk(self, run_id: int, chunk: list[TraceCall], analyzer: Analyzer) -> int:
        """Both paths on one chunk, paired and written in one transaction."""
        batch = RowBatch()
        batch_no = self._batch_no(run_id)  # both sides of a chunk share its number
        base, b_wall = self._generate(run_id, batch_no, "baseline", self.baseline_path, chunk, batch)
        cand, c_wall = self._generate(run_id, batch_no, "candidate", self.candidate_path, chunk, batch)
        shares = [b_wall / len(chunk)] * len(chunk), [c_wall / len(chunk)] * len(chunk)
        errors = self._pair(run_id, chunk, base, cand, shares, analyzer, batch)
        self.store.write_batch(batch)
        return errors

    def _stage_chunk(self, run_id: int, chunk: list[TraceCall]) -> None:
        """Path-major, first pass: the baseline's results wait in `staged_results` for the candidate's."""
        batch = RowBatch()
        results, wall = self._generate(run_id, self._batch_no(run_id), "baseline", self.baseline_path, chunk, batch)
        for call, result in zip(chunk, results):
            batch.add("staged_results", run_id=run_id, session_id=call.session_id, call_index=call.call_index,
                      side="baseline", path_name=self.baseline_path.name, wall_share_s=wall / len(chunk),
                      result=orjson.dumps(result).decode())
        self.store.write_batch(batch)

    def _pair_staged_chunk(self, run_id: int, chunk: list[TraceCall], analyzer: Analyzer) -> int:
        """Path-major, second pass: the candidate on a chunk, paired with the staged baseline results; the
        rows are written and the staged results dropped in one transaction."""
        batch = RowBatch()
        cand, c_wall = self._generate(run_id, self._batch_no(run_id), "candidate", self.candidate_path, chunk, batch)
        keys = [c.key for c in chunk]
        staged = self.store.staged_results(run_id, "baseline", keys)
        missing = [k for k in keys if k not in staged]
        if missing:
            raise StoreError(f"run {run_id}: baseline results missing for {len(missing)} calls "
                             f"(first: session {missing[0][0]} call {missing[0][1]}); resume the run")
        base = [_result_from_json(staged[k]["result"]) for k in keys]
        shares = [staged[k]["wall_share_s"] for k in keys], [c_wall / len(chunk)] * len(chunk)
        errors = self._pair(run_id, chunk, base, cand, shares, analyzer, batch)
        self.store.write_batch_unstaging(batch, run_id, keys)
        return errors

    def _pair(self, run_id: int, chunk: list[TraceCall], base: list[EngineResult], cand: list[EngineResult],
              shares: tuple[list[float], list[float]], analyzer: Analyzer, batch: RowBatch) -> int:
        """Rows for each call of a chunk; returns how many calls failed on either path (stored as error rows)."""
        errors = 0
        decode = self._decoder()
        for i, call in enumerate(chunk):
            b_res, c_res = base[i], cand[i]
            # a call's share of its batch's wall time: batched decoding has no per-request wall time
            b_out = side_output(b_res, self.baseline_path, shares[0][i])
            c_out = side_output(c_res, self.candidate_path, shares[1][i])
            if b_res.error or c_res.error:
                errors += 1
                message = "; ".join(f"{side}: {r.error}" for side, r in (("baseline", b_res), ("candidate", c_res))
                                    if r.error)
                write_call(batch, run_id, call.session_id, call.call_index, MatchStatus.ERROR,
                           customer=call.customer, detail=message)
                write_output(batch, run_id, call.session_id, call.call_index, "baseline", b_out.row())
                write_output(batch, run_id, call.session_id, call.call_index, "candidate", c_out.row())
                continue
            divergence = first_divergence(b_res, c_res, decode)
            analyzer.pair(batch, call.session_id, call.call_index, call.customer, call.tools, b_out, c_out,
                          divergence)
        analyzer.flush_issues(batch)
        return errors

    def _decoder(self) -> Callable[[list[int]], str] | None:
        """Token ids -> text for divergence evidence, from a live engine (the baseline's may be released)."""
        for path in (self.baseline_path, self.candidate_path):
            engine = self._engines.get(path.name)
            decode = getattr(engine, "tokenizer_decode", None) if engine is not None else None
            if decode is not None:
                return decode
        return None

    def _release(self, path: PathConfig) -> None:
        """Close a path's engine (frees its model, workers and memory) before the next path loads."""
        engine = self._engines.pop(path.name, None)
        close = getattr(engine, "close", None)
        if close is not None:
            close()

    def _write_trace_errors(self, run_id: int, bad_lines: list[TraceLineError]) -> None:
        batch = RowBatch()
        for err in bad_lines:
            batch.add("trace_errors", run_id=run_id, side="input", source=err.source, line=err.line,
                      field=err.field, message=err.message, excerpt=err.excerpt)
        self.store.replace_trace_errors(run_id, batch)


def _result_from_json(text: str) -> EngineResult:
    data = orjson.loads(text)
    data["top2"] = [tuple(pair) for pair in data.get("top2") or ()]
    known = EngineResult.__dataclass_fields__
    return EngineResult(**{k: v for k, v in data.items() if k in known})


def options_for_resume(store: Store, run_id: int) -> ReplayOptions:
    """The options a replay run was started with, from its run row."""
    run = store.run_row(run_id)
    if run["kind"] != "replay":
        raise StoreError(f"run {run_id} is a {run['kind']} run; only replay runs can be resumed")
    saved = orjson.loads(run["options"])
    fields = ReplayOptions.__dataclass_fields__
    return ReplayOptions(**{k: v for k, v in saved.items() if k in fields})


def _same_decoding(a: PathConfig, b: PathConfig) -> bool:
    """A noise-floor run: the same path on both sides, batch size aside (batch shape is itself a source of
    drift, which is what a batch-size noise floor measures)."""
    first, second = a.config_dict(), b.config_dict()
    first.pop("batch_size", None)
    second.pop("batch_size", None)
    return first == second


def _describe(path: PathConfig) -> str:
    spec = path.speculative
    what = f"{path.engine}:{path.model} {path.dtype} batch {path.batch_size}"
    return what + (f" spec {spec.method} k={spec.num_speculative_tokens}" if spec else " target-only")


def _sum_stats(stats: dict[str, dict]) -> dict[str, int]:
    total: dict[str, int] = {}
    for st in stats.values():
        for k, v in st.items():
            total[k] = total.get(k, 0) + v
    return total


def replay_traces(store: Store, options: ReplayOptions, progress: Progress | None = None,
                  resume: int | None = None, engine_factory: Callable[[PathConfig], Engine] = make_engine,
                  on_total: Callable[[int], None] | None = None) -> tuple[int, ReplayCounts]:
    """Start (or resume) a replay run; returns (run_id, counts)."""
    if resume is not None:
        options = options_for_resume(store, resume)
    for path in options.traces:
        if not Path(path).exists():
            raise ConfigError(f"{path}: trace file not found")
    replayer = Replayer(store, options, engine_factory)
    run_id = resume if resume is not None else replayer.create_run()
    return run_id, replayer.run(run_id, progress, on_total)
