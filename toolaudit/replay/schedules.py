"""The two orders in which a replay decodes its calls, each chunk stored in one transaction.

Call-major: per chunk, the baseline once, then each candidate on the calls it lacks; the paths' engines stay
loaded together. Path-major, for engines that must not be held together (vLLM's workers spin and starve each
other on a small CPU, and split GPU memory): the baseline over every call, its results staged in
`staged_results`, released; then each candidate in turn, paired with the staged results. Both give the same
rows; a kill loses at most the chunk in flight and the resume redoes it. The engine calls themselves run
wherever the pool runs them (`EnginePool.run_jobs`: here, or on a Ray cluster); the rows are written here."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import orjson

from toolaudit import StoreError
from toolaudit.engines import EngineRequest, EngineResult
from toolaudit.engines.paths import PathConfig
from toolaudit.ingest.traces import TraceCall
from toolaudit.replay.chunk_rows import ChunkRows
from toolaudit.replay.engine_pool import EnginePool, Job, Outputs
from toolaudit.replay.evidence import results_from_json
from toolaudit.replay.runs import Member
from toolaudit.store import RowBuffer, Store

Progress = Callable[[int], None]


class Schedule:
    """What both orders share: chunking, the chunk's engine calls as a `Job` for the pool (which runs them here or
    on a Ray cluster and hands back each chunk's outputs in order), the chunk's rows in one transaction."""

    def __init__(self, store: Store, engines: EnginePool, rows: ChunkRows, chunk: int):
        self.store, self.engines, self.rows = store, engines, rows
        self.baseline, self.candidates = rows.baseline, rows.candidates
        self.chunk = max(chunk, *(engines.rows_in_flight(p) for p in [self.baseline, *self.candidates]))

    def chunks(self, calls: list[TraceCall]) -> list[list[TraceCall]]:
        return [calls[i:i + self.chunk] for i in range(0, len(calls), self.chunk)]

    @staticmethod
    def requests(chunk: list[TraceCall], path: PathConfig) -> list[EngineRequest]:
        """Each call's request, `path.samples` times (samples 0..N-1, consecutive: an engine may decode a call's
        samples together)."""
        return [EngineRequest(f"{c.session_id}\x1f{c.call_index}", c.request.get("messages") or [], c.tools,
                              sample=i)
                for c in chunk for i in range(path.samples)]

    def decoded(self, paths: list[PathConfig], chunks: list[list[TraceCall]],
                job: Callable[[list[TraceCall]], Job]) -> Iterator[tuple[list[TraceCall], Outputs]]:
        """Each chunk with its engine calls' outputs (results and timed wall, loading left out), in order."""
        return zip(chunks, self.engines.run_jobs(paths, (job(chunk) for chunk in chunks)))

    def run(self, run_id: int, members: list[Member], needed: list[TraceCall], progress: Progress | None,
            on_total: Callable[[int], None] | None) -> None:
        raise NotImplementedError


class CallMajor(Schedule):
    def run(self, run_id: int, members: list[Member], needed: list[TraceCall], progress: Progress | None,
            on_total: Callable[[int], None] | None) -> None:
        if on_total:
            on_total(len(needed))
        paths = [self.baseline, *(m.path for m in members)]
        for chunk, outputs in self.decoded(paths, self.chunks(needed), lambda chunk: self._job(members, chunk)):
            self._chunk(members, chunk, outputs)
            if progress:
                progress(len(chunk))

    def _job(self, members: list[Member], chunk: list[TraceCall]) -> Job:
        """The baseline once, then each candidate on the calls it lacks."""
        calls = [(self.baseline, self.requests(chunk, self.baseline))]
        for m in members:
            mine = [c for c in chunk if c.key in m.todo]
            if mine:
                calls.append((m.path, self.requests(mine, m.path)))
        return Job(calls)

    def _chunk(self, members: list[Member], chunk: list[TraceCall], outputs: Outputs) -> None:
        """The chunk's rows (the baseline's, then each candidate's against it), in one transaction."""
        rows = RowBuffer()
        (base, b_wall), *candidates = outputs
        base = per_call(base, self.baseline)
        numbers = self.rows.baseline_timings(rows, members, chunk, base, b_wall)
        for m in members:
            mine = [i for i, c in enumerate(chunk) if c.key in m.todo]
            if not mine:
                continue
            calls = [chunk[i] for i in mine]
            cand, c_wall = candidates.pop(0)
            cand = per_call(cand, m.path)
            self.rows.timing(rows, m.run_id, "candidate", m.path, cand, c_wall, numbers[m.run_id])
            shares = [b_wall / len(chunk)] * len(calls), [c_wall / len(calls)] * len(calls)
            self.rows.pairs(m, calls, [base[i] for i in mine], cand, shares, rows)
        self.store.write_rows(rows)


class PathMajor(Schedule):
    def run(self, run_id: int, members: list[Member], needed: list[TraceCall], progress: Progress | None,
            on_total: Callable[[int], None] | None) -> None:
        """A single run drops each staged result with the chunk that consumes it; a matrix keeps them for the
        next candidate and drops them all at the end."""
        single = len(members) == 1 and members[0].run_id == run_id
        self.store.drop_staged(run_id, failed_only=True)  # a failed baseline call is retried, not re-used
        staged = self.store.staged_keys(run_id, "baseline")
        first = [c for c in needed if c.key not in staged]
        if on_total:
            on_total(len(first) + sum(len(m.todo) for m in members))
        for chunk, [(results, wall)] in self.decoded([self.baseline], self.chunks(first),
                                                     lambda chunk: self._one(self.baseline, chunk)):
            self._stage(run_id, members, chunk, results, wall)
            if progress:
                progress(len(chunk))
        self.engines.release(self.baseline)
        for m in members:
            chunks = self.chunks([c for c in needed if c.key in m.todo])
            for chunk, [(cand, wall)] in self.decoded([m.path], chunks, lambda chunk, p=m.path: self._one(p, chunk)):
                self._pair_staged(run_id, m, chunk, cand, wall, unstage=single)
                if progress:
                    progress(len(chunk))
            self.engines.release(m.path)
        if not single:
            self.store.drop_staged(run_id)

    def _one(self, path: PathConfig, chunk: list[TraceCall]) -> Job:
        return Job([(path, self.requests(chunk, path))])

    def _stage(self, run_id: int, members: list[Member], chunk: list[TraceCall], results: list[EngineResult],
               wall: float) -> None:
        """First pass: the baseline's results wait in `staged_results` for the candidates' (a sampled path's
        samples of a call as one JSON array)."""
        rows = RowBuffer()
        groups = per_call(results, self.baseline)
        self.rows.baseline_timings(rows, members, chunk, groups, wall)
        for call, group in zip(chunk, groups):
            rows.add("staged_results", run_id=run_id, session_id=call.session_id, call_index=call.call_index,
                     side="baseline", path_name=self.baseline.name, wall_share_s=wall / len(chunk),
                     result=orjson.dumps(group if len(group) > 1 else group[0]).decode())
        self.store.write_rows(rows)

    def _pair_staged(self, run_id: int, m: Member, chunk: list[TraceCall], cand: list[EngineResult],
                     c_wall: float, unstage: bool) -> None:
        """Second pass: one candidate on a chunk, paired with the staged baseline results."""
        rows = RowBuffer()
        cand = per_call(cand, m.path)
        self.rows.timing(rows, m.run_id, "candidate", m.path, cand, c_wall)
        keys = [c.key for c in chunk]
        staged = self.store.staged_results(run_id, "baseline", keys)
        missing = [k for k in keys if k not in staged]
        if missing:
            raise StoreError(f"run {run_id}: baseline results missing for {len(missing)} calls "
                             f"(first: session {missing[0][0]} call {missing[0][1]}); resume the run")
        base = [results_from_json(staged[k]["result"]) for k in keys]
        shares = [staged[k]["wall_share_s"] for k in keys], [c_wall / len(chunk)] * len(chunk)
        self.rows.pairs(m, chunk, base, cand, shares, rows)
        if unstage:
            self.store.write_rows_unstaging(rows, run_id, keys)
        else:
            self.store.write_rows(rows)


def per_call(results: list[EngineResult], path: PathConfig) -> list[list[EngineResult]]:
    """An engine call's results grouped by call: each call's `path.samples` samples, in sample order."""
    n = path.samples
    return [results[i:i + n] for i in range(0, len(results), n)]
