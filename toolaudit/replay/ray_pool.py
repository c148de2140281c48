"""Replay's engine calls on a Ray cluster (`toolaudit replay --ray [ADDRESS]`), as a Ray Data pipeline.

The pattern of vLLM's offline distributed inference and `ray.data.llm`: the chunks' engine calls
(`engine_pool.Job`s) become a dataset of one block per chunk, `map_batches` sends them through a pool of
stateful workers (`EngineWorker`, one Ray actor each, holding the paths' engines built once through the engine
registry, with a GPU for `cuda` paths), and the results stream back to the driver in chunk order. Only the
engine calls move: the schedule (call-major or path-major: each pass is its own pipeline, so engines that
cannot be held together never are), the rows and every transaction stay in the driver, the one writer of the
DuckDB file, which stores each chunk once as it arrives. So progress, `--resume` and the remedy matrix work as
in process, and the stored rows do not depend on Ray.

A worker that dies is restarted by Ray and its chunks retried (Ray Data's actor pool defaults: `max_restarts`
and `max_task_retries` without limit; Ray 2.60 deprecates setting them per `map_batches`); a chunk reaches the
driver, and the store, once. A pipeline that fails (a worker that cannot start, an engine that raises) stops
the run as an interrupted run that `--resume` finishes.

What the driver needs from engines it asks the workers' side: each path's fingerprint components, decoding
batch and capabilities are computed by a Ray task with the path's resources (a GPU path is fingerprinted on a
GPU, as it decodes), and every worker checks that its engines have those same components (a worker on another
GPU, CPU or library version is an error, not a silent mix). Divergence evidence decodes token ids with the
text each worker sends with its results, so the driver loads no model and imports no torch.

Connecting, the pipeline's shape and the missing-extra error are shared with `compare --ray`
(`compare.ray_cluster`, the one module that imports Ray, lazily).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from toolaudit import ConfigError, StoreError
from toolaudit.compare.ray_cluster import PickledWorker, RayOptions, connect, ordered_map, pool_size
from toolaudit.engines import Capabilities, Engine, EngineRequest, EngineResult, charged_seconds, make_engine
from toolaudit.engines.logs import EngineLogs
from toolaudit.engines.paths import PathConfig
from toolaudit.replay.engine_pool import EnginePool, Job, Outputs

TASK_RETRIES = 3  # of a path's description task


def worker_resources(paths: list[PathConfig]) -> dict[str, float]:
    """What one worker holding `paths` asks of Ray: a GPU when any path decodes on CUDA (Ray then shows the
    worker that GPU as `cuda`/`cuda:0`), else the CPUs of the most threaded path (its `threads` key, else 1)."""
    if any(p.device.startswith("cuda") for p in paths):
        return {"num_gpus": 1}
    return {"num_cpus": max(int(p.options.get("threads") or 1) for p in paths)}


@dataclass
class Description:
    """What the driver needs of a path's engine, computed where engines run."""

    components: dict[str, Any]
    rows_in_flight: int
    capabilities: Capabilities


def describe(path: PathConfig, factory: Callable[[PathConfig], Engine]) -> Description:
    """A path's fingerprint components, decoding batch and capabilities (no model loads)."""
    engine = factory(path)
    try:
        return Description(engine.fingerprint_components(), engine.rows_in_flight, engine.capabilities)
    finally:
        engine.close()


@dataclass
class Decoded:
    """One chunk's outputs as a worker sends them back: the engine calls' results and walls, the text of every
    generated token id per path (for divergence evidence), and which worker decoded it."""

    outputs: Outputs
    vocab: dict[str, dict[int, str]] = field(default_factory=dict)
    node: str = ""
    pid: int = 0


class EngineWorker(PickledWorker):
    """One Ray actor of the pipeline: the paths' engines, built and loaded once, then one chunk per call."""

    def __init__(self, paths: list[PathConfig], factory: Callable[[PathConfig], Engine],
                 expected: dict[str, dict[str, Any]]):
        super().__init__()
        self.engines: dict[str, Engine] = {}
        for path in paths:
            engine = factory(path)
            mine = engine.fingerprint_components()
            if mine != expected[path.name]:
                differ = sorted(k for k in {*mine, *expected[path.name]} if mine.get(k) != expected[path.name].get(k))
                raise ConfigError(f"paths.{path.name}: the Ray worker on {self.node} is not the path the run "
                                  f"was fingerprinted with (differs in {', '.join(differ)}); give every node "
                                  "the same hardware, libraries and model files, or set the path's `threads`")
            engine.load()
            self.engines[path.name] = engine

    def run(self, calls: list[tuple[str, list[EngineRequest]]]) -> Decoded:
        outputs: Outputs = []
        for name, requests in calls:
            engine = self.engines[name]
            t0 = time.perf_counter()
            results = engine.generate(requests)
            outputs.append((results, charged_seconds(time.perf_counter() - t0, results)))
        return Decoded(outputs, self._vocab(calls, outputs), self.node, self.pid)

    def _vocab(self, calls: list[tuple[str, list[EngineRequest]]], outputs: Outputs) -> dict[str, dict[int, str]]:
        vocab: dict[str, dict[int, str]] = {}
        for (name, _), (results, _) in zip(calls, outputs):
            engine = self.engines[name]
            if engine.capabilities.decodes_tokens:
                ids = {i for r in results for i in r.token_ids}
                vocab.setdefault(name, {}).update({i: engine.decode_tokens([i]) for i in ids})
        return vocab


class RayEnginePool(EnginePool):
    """An `EnginePool` whose engine calls run on a Ray cluster; see the module docstring.

    `workers_seen` lists (node, pid) of the worker that decoded each chunk, in the order chunks reached the
    driver."""

    def __init__(self, options: RayOptions, factory: Callable[[PathConfig], Engine] = make_engine,
                 logs: EngineLogs | None = None):
        super().__init__(factory, logs)
        self.options = options
        self._described: dict[str, Description] = {}
        self._live: set[str] = set()  # described and not released: the paths whose vocabulary evidence may use
        self._vocab: dict[str, dict[int, str]] = {}
        self.workers_seen: list[tuple[str, int]] = []

    def _describe(self, path: PathConfig) -> Description:
        if path.name not in self._described:
            ray = connect(self.options)
            task = ray.remote(describe).options(**worker_resources([path]), max_retries=TASK_RETRIES)
            self._described[path.name] = ray.get(task.remote(path, self.factory))
        self._live.add(path.name)
        return self._described[path.name]

    def engine(self, path: PathConfig) -> Engine:
        raise StoreError("engines of a Ray replay run on the cluster's workers, not in the driver")

    def fingerprint_components(self, path: PathConfig) -> dict:
        return self._describe(path).components

    def rows_in_flight(self, path: PathConfig) -> int:
        return self._describe(path).rows_in_flight

    def holds_together(self, paths: list[PathConfig]) -> bool:
        return all(self._describe(p).capabilities.holds_together for p in paths)

    def generate(self, path: PathConfig, requests: list[EngineRequest]) -> tuple[list[EngineResult], float]:
        [outputs] = self.run_jobs([path], [Job([(path, requests)])])
        return outputs[0]

    def workers(self, paths: list[PathConfig]) -> int:
        """The pool's size: `options.workers`, else what the cluster's GPUs or CPUs hold (at least 1)."""
        return pool_size(self.options, worker_resources(paths))

    def run_jobs(self, paths: list[PathConfig], jobs: Iterable[Job]) -> Iterator[Outputs]:
        """One Ray Data pipeline over the jobs (`ray_cluster.ordered_map`): one block per chunk, `workers`
        actors holding `paths`, outputs in chunk order."""
        jobs = list(jobs)
        if not jobs:
            return
        expected = {p.name: self.fingerprint_components(p) for p in paths}
        items = [[(p.name, requests) for p, requests in job.calls] for job in jobs]
        decoded_chunks = ordered_map(self.options, items, EngineWorker,
                                     {"paths": paths, "factory": self.factory, "expected": expected},
                                     self.workers(paths), worker_resources(paths), then="resume the run")
        for job, decoded in zip(jobs, decoded_chunks):
            for name, vocab in decoded.vocab.items():
                self._vocab.setdefault(name, {}).update(vocab)
            self.workers_seen.append((decoded.node, decoded.pid))
            for (path, requests), (results, _) in zip(job.calls, decoded.outputs):
                if len(results) != len(requests):
                    raise StoreError(f"engine for path {path.name!r} returned {len(results)} results for "
                                     f"{len(requests)} requests")
            yield decoded.outputs

    def decoder(self, paths: list[PathConfig]) -> Callable[[list[int]], str] | None:
        """Token ids -> text from the workers' vocabulary, choosing the path as `EnginePool.decoder` does (the
        first live one that decodes tokens); an id that path never generated is looked up in the others'
        (the same ids on the same tokenizer)."""
        for path in paths:
            if path.name in self._live and self._describe(path).capabilities.decodes_tokens:
                order = [self._vocab.get(path.name, {}), *(v for n, v in self._vocab.items() if n != path.name)]
                return lambda ids: "".join(_lookup(order, i) for i in ids)
        return None

    def release(self, path: PathConfig) -> None:
        """A pass's workers end with its pipeline; the path stops being the one evidence decodes with."""
        self._live.discard(path.name)


def _lookup(vocabularies: list[dict[int, str]], token_id: int) -> str:
    for vocab in vocabularies:
        if token_id in vocab:
            return vocab[token_id]
    return str(token_id)
