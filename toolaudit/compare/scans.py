"""Where `compare` scans the ranges of its two logs: in this process, in a pool of worker processes
(`LocalScans`), or on a Ray cluster (`ray_scan.RayScans`). Each hands back the chunks' results in task order,
so the driver, the one writer of the DuckDB file, stores the same rows whichever did the scanning."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Protocol

from toolaudit.compare.scan import ChunkResult, hold, scan_task, start_worker
from toolaudit.ingest.sources import TraceSource

# One chunk's scan: (side, start, end, schema_dir, shard, validate, out_dir), the arguments of `scan.scan_chunk`.
ScanTask = tuple
OUT_DIR = 6  # the task's folder for the chunk's Parquet file of outputs columns


class Scans(Protocol):
    def workers(self, paths: list[Path]) -> int:
        """How many scan at once (the logs are cut into about four ranges per worker)."""

    def results(self, tasks: list[ScanTask], workers: int,
                sources: list[TraceSource]) -> AbstractContextManager[Iterator[ChunkResult]]:
        """The tasks' chunk results, in task order."""


def default_workers(paths: list[Path]) -> int:
    """Worker processes: one per core for big logs; in-process for small ones (no fork cost)."""
    total = sum(p.stat().st_size for p in paths if p.exists())
    return 1 if total < 64 * (1 << 20) else max(1, min(os.cpu_count() or 1, 8))


class LocalScans:
    """Scans on this machine: `requested` worker processes (None: `default_workers`)."""

    def __init__(self, requested: int | None = None):
        self.requested = requested

    def workers(self, paths: list[Path]) -> int:
        return self.requested or default_workers(paths)

    @contextmanager
    def results(self, tasks: list[ScanTask], workers: int,
                sources: list[TraceSource]) -> Iterator[Iterator[ChunkResult]]:
        """From a process pool (each worker given the sources once, as it starts: a forked worker inherits held
        records without copying them), or computed in-process for one worker."""
        if workers <= 1 or len(tasks) <= 2:
            hold(sources)
            try:
                yield (scan_task(t) for t in tasks)
            finally:
                hold([])
            return
        ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
        pool = ctx.Pool(workers, initializer=start_worker, initargs=(sources,))
        try:
            yield pool.imap(scan_task, tasks)
        except BaseException:
            pool.terminate()
            raise
        else:
            # Not `with Pool(...)`, whose exit terminates: SIGTERM to idle workers can land while one holds the
            # task queue's lock, and the next then waits on it forever while the pool joins it (seen with the
            # workers sharing one core). Done: the workers get their stop sentinel and exit on their own.
            pool.close()
        finally:
            pool.join()
