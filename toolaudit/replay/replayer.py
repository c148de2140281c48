"""Teacher-forced replay: each recorded call, with its recorded context, through a baseline decode path and one
or more candidate paths.

With one candidate a replay is one run. With several it is a remedy matrix: one `matrix` run holding one
ordinary run per candidate (`runs.matrix_id`), the baseline decoded once and every candidate diffed against the
same baseline outputs, so the candidates' drift and speed are measured on identical traffic.

Resumable by construction: every chunk of calls is written (calls, outputs, argument diffs, timings) in one
transaction, and a resumed run skips the calls already stored in each candidate's run. A kill at any point
loses at most the chunk in flight, which the resume redoes; nothing is stored twice. Calls whose engine failed
are stored as error rows and retried on resume.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from toolaudit import ConfigError, StoreError
from toolaudit.compare.pairs import Analyzer, write_call, write_output
from toolaudit.compare.vocabulary import MatchStatus
from toolaudit.engines import Engine, EngineRequest, EngineResult, make_engine
from toolaudit.engines.fingerprint import fingerprint
from toolaudit.engines.logs import EngineLogs
from toolaudit.engines.paths import PathConfig
from toolaudit.ingest.traces import TraceCall, TraceLineError
from toolaudit.replay.engine_pool import EnginePool
from toolaudit.replay.evidence import first_divergence, result_from_json, side_output
from toolaudit.replay.inputs import ReplayOptions, load_calls, options_for_resume, resolve_paths
from toolaudit.store import RowBuffer, Store
from toolaudit.validate.schemas import SchemaRegistry

__all__ = ["ReplayCounts", "ReplayOptions", "Replayer", "first_divergence", "load_calls", "replay_traces",
           "side_output"]

Progress = Callable[[int], None]
Key = tuple[str, int]


@dataclass
class ReplayCounts:
    traces: dict[str, dict] = field(default_factory=dict)
    calls: int = 0  # usable calls selected (after --limit)
    replayed: int = 0  # done in this invocation (by at least one candidate)
    skipped: int = 0  # already stored by an earlier invocation (resume) in every candidate's run
    errors: int = 0  # calls whose engine failed on either path (summed over candidates)


@dataclass
class Member:
    """One candidate of a run: the run that holds its rows, its path, and the calls it still lacks."""

    run_id: int
    path: PathConfig
    analyzer: Analyzer
    todo: set[Key] = field(default_factory=set)
    errors: int = 0


class Replayer:
    """Drives one replay run (or remedy matrix) into the store; `run()` is safe to call again on the same run."""

    def __init__(self, store: Store, options: ReplayOptions,
                 engine_factory: Callable[[PathConfig], Engine] = make_engine, logs: EngineLogs | None = None):
        self.store, self.options = store, options
        self.baseline_path, self.candidate_paths = resolve_paths(options)
        self.engines = EnginePool(engine_factory, logs)
        self._next_chunk: dict[int, int] = {}

    # -- runs ---------------------------------------------------------------------------------------------
    def create_run(self) -> int:
        """The run row(s): one run, or a matrix run and one run per candidate. Returns the run to drive."""
        base = self.baseline_path
        base_components = self.engines.fingerprint_components(base)
        if len(self.candidate_paths) == 1:
            return self._create_member(self.candidate_paths[0], base_components, None)
        names = [p.name for p in self.candidate_paths]
        options = self.options.as_dict() | {"baseline_config": base.config_dict(),
                                            "baseline_fingerprint_components": base_components}
        matrix = self.store.create_run("matrix", self.options.run_name, base.name, ", ".join(names),
                                       _describe(base), "; ".join(_describe(p) for p in self.candidate_paths),
                                       options, fingerprint(base_components))
        for path in self.candidate_paths:
            self._create_member(path, base_components, matrix)
        return matrix

    def _create_member(self, path: PathConfig, base_components: dict, matrix_id: int | None) -> int:
        components = self.engines.fingerprint_components(path)
        options = self.options.as_dict() | {
            "candidate": path.name,
            "baseline_config": self.baseline_path.config_dict(),
            "candidate_config": path.config_dict(),
            "baseline_fingerprint_components": base_components,
            "candidate_fingerprint_components": components,
            "noise_floor": _same_decoding(self.baseline_path, path),
        }
        name = self.options.run_name
        if matrix_id is not None:
            options["candidates"] = None
            name = f"{name}/{path.name}" if name else None
        return self.store.create_run("replay", name, self.baseline_path.name, path.name,
                                     _describe(self.baseline_path), _describe(path), options,
                                     fingerprint(base_components), fingerprint(components), matrix_id)

    def members(self, run_id: int) -> list[Member]:
        """The candidates of the run (itself, or each candidate's run of a matrix), sharing one schema registry."""
        registry = SchemaRegistry(self.options.schema_dir)
        run = self.store.run_row(run_id)
        if run["kind"] != "matrix":
            return [Member(run_id, self.candidate_paths[0], Analyzer(run_id, registry))]
        by_name = {p.name: p for p in self.candidate_paths}
        return [Member(m["run_id"], by_name[m["candidate_name"]], Analyzer(m["run_id"], registry))
                for m in self.store.matrix_members(run_id)]

    def path_major(self) -> bool:
        """Run one path over the whole selection, release it, then the next: for engines that must not be
        held together (vLLM's workers spin and starve each other on a small CPU, and split GPU memory)."""
        if self.options.path_major is not None:
            return self.options.path_major
        return not self.engines.holds_together([self.baseline_path, *self.candidate_paths])

    def run(self, run_id: int, progress: Progress | None = None, on_total: Callable[[int], None] | None = None
            ) -> ReplayCounts:
        members = self.members(run_id)
        runs = {run_id, *(m.run_id for m in members)}
        for rid in runs:
            self.store.set_status(rid, "running")
        try:
            lengths: dict[str, float] = {}
            calls, bad_lines, stats = load_calls(self.options, lengths)
            # the traces' own session lengths, for session drift when the replay samples calls (see frontier)
            self.store.update_options(run_id, {"trace_session_calls": lengths})
            for m in members:
                self._write_trace_errors(m.run_id, bad_lines)
                done = self.store.stored_call_keys(m.run_id)
                m.todo = {c.key for c in calls if c.key not in done}
            needed = [c for c in calls if any(c.key in m.todo for m in members)]
            counts = ReplayCounts(traces=stats, calls=len(calls), replayed=len(needed),
                                  skipped=len(calls) - len(needed))
            if self.path_major():
                self._run_path_major(run_id, members, needed, progress, on_total)
            else:
                if on_total:
                    on_total(len(needed))
                for chunk in self._chunks(needed):
                    self._replay_chunk(members, chunk)
                    if progress:
                        progress(len(chunk))
        except BaseException:
            for rid in runs:
                self.store.set_status(rid, "interrupted")
            raise
        finally:  # free models and engine processes (vLLM workers spin while idle) as soon as the run ends
            for path in (self.baseline_path, *self.candidate_paths):
                self.engines.release(path)
        counts.errors = sum(m.errors for m in members)
        shard = {"shard": self.options.shard} if self.options.shard else {}
        for m in members:
            mine = ReplayCounts(traces=stats, calls=len(calls), replayed=len(m.todo),
                                skipped=len(calls) - len(m.todo), errors=m.errors)
            self.store.finish_run(m.run_id, {"replay": mine.__dict__, "baseline": _sum_stats(stats),
                                             "candidate": _sum_stats(stats), **shard})
        if run_id not in {m.run_id for m in members}:
            self.store.finish_run(run_id, {"replay": counts.__dict__, "input": _sum_stats(stats), **shard,
                                           "candidates": {m.path.name: m.run_id for m in members}})
        return counts

    # -- the two schedules --------------------------------------------------------------------------------
    def _chunks(self, calls: list[TraceCall]) -> list[list[TraceCall]]:
        size = max(self.options.chunk, self.baseline_path.batch_size, *(p.batch_size for p in self.candidate_paths))
        return [calls[i:i + size] for i in range(0, len(calls), size)]

    def _replay_chunk(self, members: list[Member], chunk: list[TraceCall]) -> None:
        """Call-major: the baseline once, then each candidate on the calls it lacks, all in one transaction."""
        rows = RowBuffer()
        base, b_wall = self._generate(self.baseline_path, chunk)
        numbers = self._baseline_rows(rows, members, chunk, base, b_wall)
        for m in members:
            mine = [i for i, c in enumerate(chunk) if c.key in m.todo]
            if not mine:
                continue
            calls = [chunk[i] for i in mine]
            cand, c_wall = self._generate(m.path, calls)
            self._chunk_row(rows, m.run_id, "candidate", m.path, cand, c_wall, numbers[m.run_id])
            shares = [b_wall / len(chunk)] * len(calls), [c_wall / len(calls)] * len(calls)
            self._pair(m, calls, [base[i] for i in mine], cand, shares, rows)
        self.store.write_rows(rows)

    def _run_path_major(self, run_id: int, members: list[Member], needed: list[TraceCall],
                        progress: Progress | None, on_total: Callable[[int], None] | None) -> None:
        """The baseline over every call (results staged under `run_id`), released; then each candidate in turn,
        paired with the staged results. A single run drops each staged result with the chunk that consumes it;
        a matrix keeps them for the next candidate and drops them all at the end."""
        single = len(members) == 1 and members[0].run_id == run_id
        self.store.drop_staged(run_id, failed_only=True)  # a failed baseline call is retried, not re-used
        staged = self.store.staged_keys(run_id, "baseline")
        first = [c for c in needed if c.key not in staged]
        if on_total:
            on_total(len(first) + sum(len(m.todo) for m in members))
        for chunk in self._chunks(first):
            self._stage_chunk(run_id, members, chunk)
            if progress:
                progress(len(chunk))
        self.engines.release(self.baseline_path)
        for m in members:
            for chunk in self._chunks([c for c in needed if c.key in m.todo]):
                self._pair_staged_chunk(run_id, m, chunk, unstage=single)
                if progress:
                    progress(len(chunk))
            self.engines.release(m.path)
        if not single:
            self.store.drop_staged(run_id)

    def _stage_chunk(self, run_id: int, members: list[Member], chunk: list[TraceCall]) -> None:
        """Path-major, first pass: the baseline's results wait in `staged_results` for the candidates'."""
        rows = RowBuffer()
        results, wall = self._generate(self.baseline_path, chunk)
        self._baseline_rows(rows, members, chunk, results, wall)
        for call, result in zip(chunk, results):
            rows.add("staged_results", run_id=run_id, session_id=call.session_id, call_index=call.call_index,
                      side="baseline", path_name=self.baseline_path.name, wall_share_s=wall / len(chunk),
                      result=orjson.dumps(result).decode())
        self.store.write_rows(rows)

    def _pair_staged_chunk(self, run_id: int, m: Member, chunk: list[TraceCall], unstage: bool) -> None:
        """Path-major, second pass: one candidate on a chunk, paired with the staged baseline results."""
        rows = RowBuffer()
        cand, c_wall = self._generate(m.path, chunk)
        self._chunk_row(rows, m.run_id, "candidate", m.path, cand, c_wall)
        keys = [c.key for c in chunk]
        staged = self.store.staged_results(run_id, "baseline", keys)
        missing = [k for k in keys if k not in staged]
        if missing:
            raise StoreError(f"run {run_id}: baseline results missing for {len(missing)} calls "
                             f"(first: session {missing[0][0]} call {missing[0][1]}); resume the run")
        base = [result_from_json(staged[k]["result"]) for k in keys]
        shares = [staged[k]["wall_share_s"] for k in keys], [c_wall / len(chunk)] * len(chunk)
        self._pair(m, chunk, base, cand, shares, rows)
        if unstage:
            self.store.write_rows_unstaging(rows, run_id, keys)
        else:
            self.store.write_rows(rows)

    # -- engine calls and rows ----------------------------------------------------------------------------
    def _generate(self, path: PathConfig, chunk: list[TraceCall]) -> tuple[list[EngineResult], float]:
        """One engine call for a chunk, timed (model loading left out)."""
        requests = [EngineRequest(f"{c.session_id}\x1f{c.call_index}", c.request.get("messages") or [],
                                  c.tools) for c in chunk]
        return self.engines.generate(path, requests)

    def _chunk_row(self, rows: RowBuffer, run_id: int, side: str, path: PathConfig, results: list[EngineResult],
                   wall: float, chunk_no: int | None = None) -> int:
        """A `replay_chunks` row (timings of one engine call, or a member's share of it) among the chunk's rows."""
        if chunk_no is None:
            chunk_no = self._chunk_no(run_id)
        rows.add("replay_chunks", run_id=run_id, chunk_no=chunk_no, side=side, path_name=path.name,
                  calls=len(results), wall_s=wall, completion_tokens=sum(r.completion_tokens for r in results),
                  drafted_tokens=sum(r.drafted_tokens for r in results),
                  accepted_tokens=sum(r.accepted_tokens for r in results),
                  forward_passes=sum(r.forward_passes for r in results),
                  errors=sum(1 for r in results if r.error))
        return chunk_no

    def _baseline_rows(self, rows: RowBuffer, members: list[Member], chunk: list[TraceCall],
                       results: list[EngineResult], wall: float) -> dict[int, int]:
        """The shared baseline's timings, recorded in each candidate's run (prorated to the calls it lacks),
        so every candidate run reads on its own with the baseline it was measured against. Returns each run's
        chunk number (a call-major chunk's candidate row shares it)."""
        numbers = {}
        for m in members:
            mine = [r for c, r in zip(chunk, results) if c.key in m.todo]
            if mine:
                numbers[m.run_id] = self._chunk_row(rows, m.run_id, "baseline", self.baseline_path, mine,
                                                    wall * len(mine) / len(chunk))
        return numbers

    def _chunk_no(self, run_id: int) -> int:
        if run_id not in self._next_chunk:
            self._next_chunk[run_id] = self.store.next_chunk_no(run_id)
        self._next_chunk[run_id] += 1
        return self._next_chunk[run_id] - 1

    def _pair(self, m: Member, chunk: list[TraceCall], base: list[EngineResult], cand: list[EngineResult],
              shares: tuple[list[float], list[float]], rows: RowBuffer) -> None:
        """Rows for each call of a chunk in one candidate's run; failed calls become error rows."""
        decode = self.engines.decoder([self.baseline_path, *self.candidate_paths])
        for i, call in enumerate(chunk):
            b_res, c_res = base[i], cand[i]
            # a call's share of its engine call's wall time: batched decoding has no per-request wall time
            b_out = side_output(b_res, self.baseline_path, shares[0][i])
            c_out = side_output(c_res, m.path, shares[1][i])
            if b_res.error or c_res.error:
                m.errors += 1
                message = "; ".join(f"{side}: {r.error}" for side, r in (("baseline", b_res), ("candidate", c_res))
                                    if r.error)
                write_call(rows, m.run_id, call.session_id, call.call_index, MatchStatus.ERROR,
                           customer=call.customer, detail=message)
                write_output(rows, m.run_id, call.session_id, call.call_index, "baseline", b_out.row())
                write_output(rows, m.run_id, call.session_id, call.call_index, "candidate", c_out.row())
                continue
            m.analyzer.pair(rows, call.session_id, call.call_index, call.customer, call.tools, b_out, c_out,
                          first_divergence(b_res, c_res, decode))
        m.analyzer.flush_issues(rows)

    def _write_trace_errors(self, run_id: int, bad_lines: list[TraceLineError]) -> None:
        rows = RowBuffer()
        for err in bad_lines:
            rows.add("trace_errors", run_id=run_id, side="input", source=err.source, line=err.line,
                      field=err.field, message=err.message, excerpt=err.excerpt)
        self.store.replace_trace_errors(run_id, rows)


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
                  on_total: Callable[[int], None] | None = None, logs: EngineLogs | None = None
                  ) -> tuple[int, ReplayCounts]:
    """Start (or resume) a replay run or remedy matrix; returns (run_id, counts). `logs` says where engines'
    own output goes (default: wherever it would go)."""
    if resume is not None:
        resume, options = options_for_resume(store, resume)
    for path in options.traces:
        if not Path(path).exists():
            raise ConfigError(f"{path}: trace file not found")
    replayer = Replayer(store, options, engine_factory, logs)
    run_id = resume if resume is not None else replayer.create_run()
    return run_id, replayer.run(run_id, progress, on_total)
