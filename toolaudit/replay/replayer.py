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

from toolaudit import TraceFileNotFound
from toolaudit.engines import Engine, make_engine
from toolaudit.engines.logs import EngineLogs
from toolaudit.engines.paths import PathConfig
from toolaudit.replay.chunk_rows import ChunkRows
from toolaudit.replay.engine_pool import EnginePool
from toolaudit.replay.evidence import first_divergence, side_output
from toolaudit.replay.inputs import ReplayOptions, load_calls, options_for_resume, resolve_paths
from toolaudit.replay.runs import Member, RunRows
from toolaudit.replay.schedules import CallMajor, PathMajor, Progress, Schedule
from toolaudit.store import Store

__all__ = ["ReplayCounts", "ReplayOptions", "Replayer", "first_divergence", "load_calls", "replay_traces",
           "side_output"]


@dataclass
class ReplayCounts:
    traces: dict[str, dict] = field(default_factory=dict)
    calls: int = 0  # usable calls selected (after --limit)
    replayed: int = 0  # done in this invocation (by at least one candidate)
    skipped: int = 0  # already stored by an earlier invocation (resume) in every candidate's run
    errors: int = 0  # calls whose engine failed on either path (summed over candidates)
    warnings: list[str] = field(default_factory=list)  # what the traces' calls lack (ingest.gaps; not stored)

    def stored(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "warnings"}


class Replayer:
    """Drives one replay run (or remedy matrix) into the store; `run()` is safe to call again on the same run.

    The steps live beside it: `RunRows` (run rows and members), a `Schedule` (call-major or path-major, one
    transaction per chunk), `ChunkRows` (engine results to rows) and the `EnginePool` (engine lifecycle)."""

    def __init__(self, store: Store, options: ReplayOptions,
                 engine_factory: Callable[[PathConfig], Engine] = make_engine, logs: EngineLogs | None = None,
                 engines: EnginePool | None = None):
        self.store, self.options = store, options
        self.baseline_path, self.candidate_paths = resolve_paths(options)
        # `engines`: where engine calls run (a `ray_pool.RayEnginePool` for `--ray`); default: in this process
        self.engines = engines or EnginePool(engine_factory, logs)
        self.runs = RunRows(store, options, self.baseline_path, self.candidate_paths, self.engines)
        self.rows = ChunkRows(store, self.baseline_path, self.candidate_paths, self.engines)

    def create_run(self) -> int:
        return self.runs.create()

    def members(self, run_id: int) -> list[Member]:
        return self.runs.members(run_id)

    def path_major(self) -> bool:
        """Run one path over the whole selection, release it, then the next: for engines that must not be
        held together (vLLM's workers spin and starve each other on a small CPU, and split GPU memory)."""
        if self.options.path_major is not None:
            return self.options.path_major
        return not self.engines.holds_together([self.baseline_path, *self.candidate_paths])

    def schedule(self) -> Schedule:
        kind = PathMajor if self.path_major() else CallMajor
        return kind(self.store, self.engines, self.rows, self.options.chunk)

    def run(self, run_id: int, progress: Progress | None = None, on_total: Callable[[int], None] | None = None
            ) -> ReplayCounts:
        """Replay what the run still lacks, then finish its runs. Stopped anywhere (an error, Ctrl-C, SIGTERM),
        the runs not yet complete are marked `interrupted` for `--resume`, their whole chunks kept."""
        runs = {run_id}
        self.store.active_run = run_id  # named in the snapshots readers see meanwhile
        try:
            members = self.members(run_id)
            runs |= {m.run_id for m in members}
            for rid in runs:
                self.store.set_status(rid, "running")
            try:
                counts, calls, stats = self._replay(run_id, members, progress, on_total)
            finally:  # free models and engine processes (vLLM workers spin while idle) as soon as the run ends
                for path in (self.baseline_path, *self.candidate_paths):
                    self.engines.release(path)
            self._finish(run_id, members, counts, len(calls), stats)
        except BaseException:
            self.store.mark_interrupted(runs)
            raise
        return counts

    def _replay(self, run_id: int, members: list[Member], progress: Progress | None,
                on_total: Callable[[int], None] | None) -> tuple[ReplayCounts, list, dict]:
        lengths: dict[str, float] = {}
        warnings: list[str] = []
        calls, bad_lines, stats = load_calls(self.options, lengths, warnings)
        # the traces' own session lengths, for session drift when the replay samples calls (see frontier)
        self.store.update_options(run_id, {"trace_session_calls": lengths})
        for m in members:
            self.rows.trace_errors(m.run_id, bad_lines)
            done = self.store.stored_call_keys(m.run_id)
            m.todo = {c.key for c in calls if c.key not in done}
        needed = [c for c in calls if any(c.key in m.todo for m in members)]
        counts = ReplayCounts(traces=stats, calls=len(calls), replayed=len(needed),
                              skipped=len(calls) - len(needed), warnings=warnings)
        self.schedule().run(run_id, members, needed, progress, on_total)
        return counts, calls, stats

    def _finish(self, run_id: int, members: list[Member], counts: ReplayCounts, calls: int, stats: dict) -> None:
        counts.errors = sum(m.errors for m in members)
        shard = {"shard": self.options.shard} if self.options.shard else {}
        for m in members:
            mine = ReplayCounts(traces=stats, calls=calls, replayed=len(m.todo),
                                skipped=calls - len(m.todo), errors=m.errors)
            self.store.finish_run(m.run_id, {"replay": mine.stored(), "baseline": _sum_stats(stats),
                                             "candidate": _sum_stats(stats), **shard})
        if run_id not in {m.run_id for m in members}:
            self.store.finish_run(run_id, {"replay": counts.stored(), "input": _sum_stats(stats), **shard,
                                           "candidates": {m.path.name: m.run_id for m in members}})


def _sum_stats(stats: dict[str, dict]) -> dict[str, int]:
    total: dict[str, int] = {}
    for st in stats.values():
        for k, v in st.items():
            total[k] = total.get(k, 0) + v
    return total


def replay_traces(store: Store, options: ReplayOptions, progress: Progress | None = None,
                  resume: int | None = None, engine_factory: Callable[[PathConfig], Engine] = make_engine,
                  on_total: Callable[[int], None] | None = None, logs: EngineLogs | None = None,
                  engines: EnginePool | None = None, on_probe: Callable[[str], None] | None = None
                  ) -> tuple[int, ReplayCounts]:
    """Start (or resume) a replay run or remedy matrix; returns (run_id, counts). `logs` says where engines'
    own output goes (default: wherever it would go). `engines`: where engine calls run (default: an
    `EnginePool` of `engine_factory`'s engines in this process; `ray_pool.RayEnginePool` for a Ray cluster).
    Neither is part of the run's options: the stored run is the same wherever its engines ran. `on_probe`: probe
    the paths of a new run first and store the probes with it, reporting each (`probes.record_run_probes`: a
    small probe, seconds per path; an endpoint's within a deadline; one that fails is recorded as unavailable and
    the replay goes on)."""
    if resume is not None:
        resume, options = options_for_resume(store, resume)
    for path in options.traces:
        if not Path(path).exists():
            raise TraceFileNotFound(str(path), "trace file not found")
    replayer = Replayer(store, options, engine_factory, logs, engines)
    run_id = resume if resume is not None else replayer.create_run()
    if on_probe is not None and resume is None:
        from toolaudit.replay.probes import record_run_probes

        record_run_probes(store, run_id, replayer, on_probe)
    return run_id, replayer.run(run_id, progress, on_total)
