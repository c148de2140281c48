"""`compare --ray [ADDRESS]`: the scans of the two logs' ranges (parsing, digesting, validating every call of a
chunk) on a Ray cluster, as a Ray Data pipeline (`ray_cluster.ordered_map`), the driver still the one writer.

Each scan task is one block; a pool of `ScanWorker` actors (one CPU each) holds the comparison's sources and
scans one range per call, exactly as a local worker process does (`scan.scan_task`). What a chunk yields comes
back to the driver in task order: its digests, errors, counts and notes in one pickled `ChunkResult`, and its
outputs columns as the bytes of the Parquet file the worker wrote in its own temporary folder (the driver writes
them into the run's folder, where the staging's final insert reads them). The join, the re-reading of the pairs
that differ and every transaction stay in the driver, so the tables equal an in-process compare's.

The workers read the logs where they are (a log scanned in ranges) and the `--schemas` folder: on a cluster,
both must be on a path every node shares, at the same place; a worker starts in the driver's working folder
when its node has it, so relative paths mean what they meant to the driver. A log read whole (a Langfuse
export) travels in the workers' set-up instead.

A worker that dies is restarted and its range scanned again (see `ray_cluster`); the driver receives each chunk
once. A compare has no `--resume`: a pipeline that fails leaves the run `interrupted`, to run again.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from toolaudit import ConfigError
from toolaudit.compare.ray_cluster import PickledWorker, RayOptions, ordered_map, pool_size
from toolaudit.compare.scan import ChunkResult, hold, scan_task
from toolaudit.compare.scans import OUT_DIR, ScanTask
from toolaudit.ingest.sources import TraceSource

RESOURCES = {"num_cpus": 1}  # a scan is one Python thread


@dataclass
class RemoteChunk:
    """One range's scan as a worker sends it back: the chunk (without a file name), the bytes of its outputs
    Parquet file (None when it digested no call), and which worker scanned it."""

    chunk: ChunkResult
    outputs: bytes | None
    node: str
    pid: int


class ScanWorker(PickledWorker):
    """One Ray actor of the pipeline: the comparison's sources, held once, then one range per call."""

    def __init__(self, sources: list[TraceSource], cwd: str, scan: Callable[[ScanTask], ChunkResult]):
        super().__init__()
        if os.path.isdir(cwd):
            os.chdir(cwd)
        for src in sources:
            if src.preset is None and not os.access(src.source, os.R_OK):  # scanned where it is
                raise ConfigError(f"{src.source}: not readable by the Ray worker on {self.node} (from "
                                  f"{os.getcwd()}); compare --ray needs the logs on a path every node shares")
        hold(sources)
        self.scan = scan
        self.out_dir = tempfile.mkdtemp(prefix="toolaudit-scan-")

    def run(self, task: ScanTask) -> RemoteChunk:
        chunk = self.scan((*task[:OUT_DIR], self.out_dir))
        outputs = None
        if chunk.outputs_file is not None:
            outputs = Path(chunk.outputs_file).read_bytes()
            os.unlink(chunk.outputs_file)
            chunk.outputs_file = None
        return RemoteChunk(chunk, outputs, self.node, self.pid)


class RayScans:
    """`Scans` on a Ray cluster (see the module docstring). `scan`: what a worker runs per range (a test wraps
    it); `workers_seen` lists (node, pid) of the worker that scanned each chunk, in the order chunks arrived."""

    def __init__(self, options: RayOptions, scan: Callable[[ScanTask], ChunkResult] = scan_task):
        self.options, self.scan = options, scan
        self.workers_seen: list[tuple[str, int]] = []

    def workers(self, paths: list[Path]) -> int:
        """`options.workers`, else one per CPU of the cluster."""
        return pool_size(self.options, RESOURCES)

    @contextmanager
    def results(self, tasks: list[ScanTask], workers: int,
                sources: list[TraceSource]) -> Iterator[Iterator[ChunkResult]]:
        yield self._chunks(tasks, workers, sources)

    def _chunks(self, tasks: list[ScanTask], workers: int, sources: list[TraceSource]) -> Iterator[ChunkResult]:
        remote = ordered_map(self.options, tasks, ScanWorker,
                             {"sources": sources, "cwd": os.getcwd(), "scan": self.scan}, workers, RESOURCES)
        for task, got in zip(tasks, remote):
            self.workers_seen.append((got.node, got.pid))
            chunk = got.chunk
            if got.outputs is not None:
                fd, chunk.outputs_file = tempfile.mkstemp(prefix=f"chunk-{task[0]}-{task[1]}-", suffix=".parquet",
                                                          dir=task[OUT_DIR])
                with os.fdopen(fd, "wb") as out:
                    out.write(got.outputs)
            yield chunk
