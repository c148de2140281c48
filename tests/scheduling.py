"""How `make test`'s two xdist workers share the suite: units, and the order they are handed out in.

A unit is a test file, or files and folders whose tests share an expensive session fixture and so must run on one
worker (or each worker would build it again): the vLLM tests (one model at a time: two vLLMs on two cores starve
each other), the tracing recordings (one served model) and the two Ray modules (one local Ray). Units go out longest
first by their measured seconds (tests/durations.json, written by scripts/test_durations.py), each to whichever
worker is free: longest-processing-time scheduling, so neither worker idles on the other's tail. A unit missing
from the table (a new file) is estimated from its test count."""

from __future__ import annotations

import json
from pathlib import Path

SHARED_FOLDERS = {"tests/engines/vllm/": "vllm", "tests/tracing/": "tracing",
                  "tests/replay/test_ray.py": "ray", "tests/compare/test_compare_ray.py": "ray"}
DURATIONS = Path(__file__).with_name("durations.json")
SECONDS_PER_UNKNOWN_TEST = 0.25  # the suite's median test, setup and teardown included (0.21 s, stop 47)


def unit_of(path: str) -> str:
    """The unit a test file belongs to (its shared folder's name, else the file's path)."""
    return next((name for folder, name in SHARED_FOLDERS.items() if path.startswith(folder)), path)


def measured_seconds() -> dict[str, float]:
    try:
        return json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}


def expected_seconds(unit: str, tests: int, table: dict[str, float]) -> float:
    """The unit's measured seconds, or an estimate from its test count."""
    return table.get(unit, tests * SECONDS_PER_UNKNOWN_TEST)
