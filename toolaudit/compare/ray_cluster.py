"""Ray, for `replay --ray` and `compare --ray`: connecting to a cluster (or a local Ray), and the one pipeline
shape both use, an ordered Ray Data `map_batches` of pickled items through a pool of stateful actors.

Both commands keep their driver the one writer of the DuckDB file: only per-chunk work travels (replay's engine
calls, `replay.ray_pool`; compare's scans of log ranges, `compare.ray_scan`), each chunk one block, and the
results come back in chunk order, so the driver stores them exactly as in process. A worker that dies is
restarted by Ray and its chunk retried (Ray Data's actor pool defaults: `max_restarts` and `max_task_retries`
without limit); each chunk reaches the driver once.

Ray is imported only here, and only when a pipeline starts: without it `--ray` says which extra to install.
(It lives in `compare`, the lower of the two wings: `replay` already builds on `compare`.)
"""

from __future__ import annotations

import os
import pickle
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from toolaudit import ConfigError, StoreError, ToolauditError

INSTALL = "pip install 'toolaudit[ray]'"
# Chunks sent to one worker at a time. One: a dead worker leaves one chunk to redo, and no chunk waits behind
# another on a worker while the driver, storing in chunk order, waits for it; the round trip between chunks
# (milliseconds) is small beside the work of a chunk.
IN_FLIGHT_PER_WORKER = 1


@dataclass(frozen=True)
class RayOptions:
    """Where the per-chunk work goes. `address`: None starts a local Ray for this process; otherwise what
    `ray.init(address=...)` takes ("auto" for the cluster this node belongs to, "ray://HOST:10001", "HOST:6379").
    `workers`: workers per pipeline; None: as many as the cluster's GPUs or CPUs hold."""

    address: str | None = None
    workers: int | None = None


def import_ray() -> Any:
    """The `ray` module with Ray Data, or a `ConfigError` naming the extra to install."""
    try:
        import ray
        import ray.data  # noqa: F401 -- the pipeline needs Ray Data, not only Ray Core
    except ImportError as exc:
        raise ConfigError(f"--ray needs Ray with Ray Data: {INSTALL} ({exc})") from None
    return ray


def connect(options: RayOptions) -> Any:
    """Ray, initialised once per process: the cluster at `options.address`, or a local one."""
    ray = import_ray()
    if not ray.is_initialized():
        try:
            if options.address is None:
                ray.init(include_dashboard=False, log_to_driver=False)
            else:
                ray.init(address=options.address, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            where = options.address or "a local Ray"
            raise ConfigError(f"--ray {where}: cannot connect ({type(exc).__name__}: {exc})") from None
    return ray


def pool_size(options: RayOptions, resources: dict[str, float]) -> int:
    """Workers of a pipeline whose workers each ask `resources`: `options.workers`, else what the cluster's
    GPUs (`num_gpus`) or CPUs (`num_cpus`) hold, at least 1."""
    if options.workers:
        return options.workers
    have = connect(options).cluster_resources()
    kind, per = ("GPU", resources["num_gpus"]) if "num_gpus" in resources else ("CPU", resources["num_cpus"])
    return max(1, int(have.get(kind, 0) // per))


# the last line of a Ray error raised by toolaudit in a worker ("toolaudit.ConfigError: paths.x: ...")
_RAISED = re.compile(r"^toolaudit(?:\.\w+)*\.(\w+Error): (.+)$", re.M)


def worker_error(exc: Exception) -> ToolauditError:
    """A pipeline's failure as the library's own error: what a worker raised on purpose (a `ConfigError` from its
    set-up reaches the driver as Ray's `ActorDiedError`, with only the text of the original), else what Ray
    said, in one line (the CLI prints library errors, not tracebacks)."""
    raised = _RAISED.findall(str(exc))
    if raised:
        name, message = raised[-1]
        return ConfigError(message) if name == "ConfigError" else StoreError(message)
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    return StoreError(f"the Ray pipeline failed ({type(exc).__name__}: {first})")


class PickledWorker:
    """A stateful worker of `ordered_map`: one Ray actor, set up once, then one item per call (`run`).

    Items and results travel pickled (one bytes column each), so the commands' dataclasses cross unchanged."""

    def __init__(self) -> None:
        self.node, self.pid = socket.gethostname(), os.getpid()

    def run(self, item: Any) -> Any:
        raise NotImplementedError

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa

        out = [pickle.dumps(self.run(pickle.loads(blob))) for blob in batch.column("item").to_pylist()]
        return pa.table({"result": pa.array(out, pa.binary())})


def ordered_map(options: RayOptions, items: list[Any], worker: type[PickledWorker], kwargs: dict[str, Any],
                workers: int, resources: dict[str, float], then: str = "run it again") -> Iterator[Any]:
    """`worker(**kwargs).run(item)` for every item, on `workers` actors each holding `resources`, yielded in the
    items' order as soon as each is there (a chunk is stored only after those before it, as in process).
    `then`: what the user should do when the pipeline ends short."""
    if not items:
        return
    payload = [{"item": pickle.dumps(item)} for item in items]
    ray = connect(options)
    ds = ray.data.from_items(payload, override_num_blocks=len(payload))
    ds.context.execution_options.preserve_order = True
    ds.context.enable_progress_bars = False
    ds = ds.map_batches(
        worker, fn_constructor_kwargs=kwargs, batch_size=1, batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=min(workers, len(payload)),
                                           max_tasks_in_flight_per_actor=IN_FLIGHT_PER_WORKER),
        **resources)
    got = 0
    try:
        # one block per item, handed over as soon as it is there (no prefetch: it would wait for the next one)
        for table in ds.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=0):
            for blob in table.column("result").to_pylist():
                got += 1
                yield pickle.loads(blob)
    except ray.exceptions.RayError as exc:
        raise worker_error(exc) from exc
    if got != len(payload):
        raise StoreError(f"the Ray pipeline returned {got} chunks for {len(payload)}; {then}")
