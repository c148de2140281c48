"""The Ray tests' local Ray, and the gate actor the killed-worker tests hold later work on (no timing)."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import pytest
from conftest import REPO


def local_ray(tmp_path_factory, module: str) -> Any:
    """Ray on 2 CPUs for the Ray tests, started once for both Ray test modules (tests/scheduling.py keeps them on
    one worker, one after the other: one start, ~5 s, and one pool of worker processes) and stopped as soon as
    the next test is not one of theirs (tests/conftest.py), so no idle Ray shares the cores with later tests.
    `module` (its gated scans or factories) and this one (the gate) travel to the workers by value: the workers
    import toolaudit from the checkout, not the tests."""
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.data")
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[module])
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 _temp_dir=str(tmp_path_factory.mktemp("ray")),
                 runtime_env={"env_vars": {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}})
    return ray


def stop_local_ray() -> None:
    """Stop the tests' local Ray, if one runs."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


def open_gate_actor():
    """A Ray actor whose `wait()` returns once `open()` was called: the gate the workers' calls wait on."""
    import asyncio

    import ray

    @ray.remote(num_cpus=0)
    class Gate:
        def __init__(self):
            self.opened = asyncio.Event()

        async def wait(self) -> bool:
            await self.opened.wait()
            return True

        async def open(self) -> None:
            self.opened.set()

    return Gate.remote()


class KillFirstWorker:
    """A progress callback: once the first chunk (or range) is stored, while the gate holds every later one in
    flight, SIGKILL the worker that did it and open the gate. `runner.workers_seen` lists (index, pid) pairs."""

    def __init__(self, runner, gate):
        self.runner, self.gate = runner, gate
        self.killed: list[int] = []

    def __call__(self, n: int) -> None:
        import ray

        if not self.killed:
            self.killed.append(self.runner.workers_seen[0][1])
            os.kill(self.killed[0], signal.SIGKILL)
            ray.get(self.gate.open.remote())
