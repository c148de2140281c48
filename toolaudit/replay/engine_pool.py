"""The engines of one replay, one per decode path, through the engine contract only (`toolaudit.engines.base`):
made on first use, loaded outside the path's timings, released as soon as the path is done (vLLM's workers
spin while idle, and engines that cannot be held together must not overlap). Every engine call runs inside
`EngineLogs.captured()`, so engines' own output goes to the log file unless the user asked to see it.

A schedule hands the pool `Job`s (one chunk's engine calls, in order) and stores each chunk's outputs as they
come back (`run_jobs`): here one job after the other, in this process; `ray_pool.RayEnginePool` sends them to a
Ray cluster instead, and the schedule, the rows and the store are the same."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from toolaudit import StoreError
from toolaudit.engines import Engine, EngineRequest, EngineResult, charged_seconds, make_engine
from toolaudit.engines.logs import EngineLogs
from toolaudit.engines.paths import PathConfig


@dataclass
class Job:
    """One chunk's engine calls, run in this order: (path, requests) each."""

    calls: list[tuple[PathConfig, list[EngineRequest]]]


# One (results, wall seconds) per engine call of a job, in the job's order.
Outputs = list[tuple[list[EngineResult], float]]


class EnginePool:
    def __init__(self, factory: Callable[[PathConfig], Engine] = make_engine, logs: EngineLogs | None = None):
        self.factory = factory
        self.logs = logs or EngineLogs(None)
        self._engines: dict[str, Engine] = {}

    def engine(self, path: PathConfig) -> Engine:
        if path.name not in self._engines:
            with self.logs.captured():
                self._engines[path.name] = self.factory(path)
        return self._engines[path.name]

    def fingerprint_components(self, path: PathConfig) -> dict:
        engine = self.engine(path)
        with self.logs.captured():
            return engine.fingerprint_components()

    def rows_in_flight(self, path: PathConfig) -> int:
        """Requests the path decodes together (`Engine.rows_in_flight`): the least calls a chunk should hold."""
        return self.engine(path).rows_in_flight

    def holds_together(self, paths: list[PathConfig]) -> bool:
        """Whether these paths' engines may be loaded at the same time (see `Capabilities.holds_together`)."""
        return all(self.engine(p).capabilities.holds_together for p in paths)

    def generate(self, path: PathConfig, requests: list[EngineRequest]) -> tuple[list[EngineResult], float]:
        """One engine call, timed (loading excluded: it is not decoding), with the prefill it reused from other
        paths charged to it (`charged_seconds`)."""
        engine = self.engine(path)
        with self.logs.captured():
            engine.load()
            t0 = time.perf_counter()
            out = engine.generate(requests)
            wall = charged_seconds(time.perf_counter() - t0, out)
        if len(out) != len(requests):
            raise StoreError(f"engine for path {path.name!r} returned {len(out)} results for "
                             f"{len(requests)} requests")
        return out, wall

    def run_jobs(self, paths: list[PathConfig], jobs: Iterable[Job]) -> Iterator[Outputs]:
        """Each job's outputs, in job order. Lazily, one job at a time: the schedule stores a chunk before the
        next one decodes. `paths` are the paths the jobs use (a remote pool builds workers that hold them)."""
        for job in jobs:
            yield [self.generate(path, requests) for path, requests in job.calls]

    def decoder(self, paths: list[PathConfig]) -> Callable[[list[int]], str] | None:
        """Token ids -> text for divergence evidence, from the first live engine of `paths` that decodes tokens
        (the baseline's may have been released)."""
        for path in paths:
            engine = self._engines.get(path.name)
            if engine is not None and engine.capabilities.decodes_tokens:
                return engine.decode_tokens
        return None

    def release(self, path: PathConfig) -> None:
        """Close a path's engine (frees its model, workers and memory) before the next path loads."""
        engine = self._engines.pop(path.name, None)
        if engine is not None:
            with self.logs.captured():
                engine.close()
