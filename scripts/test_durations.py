"""Write tests/durations.json: each scheduling unit's seconds, from a JUnit XML of a `make test-avx2` run.

Why: `make test` hands whole units (a file, or a folder sharing a session fixture) to two xdist workers, longest
first, so that neither waits on the other's tail. Ordering by a guess (test counts) left about a minute of one
worker idle at the end; ordering by measured seconds is longest-processing-time scheduling. Regenerate after a
change that moves a unit's time by tens of seconds:

    .venv/bin/python -m pytest -q -n 2 --junitxml=/tmp/junit.xml   # with the AVX2 variables (make test-avx2)
    .venv/bin/python scripts/test_durations.py /tmp/junit.xml
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from scheduling import unit_of  # noqa: E402  (tests/scheduling.py: the one definition of a unit)


def unit_seconds(junit: Path) -> dict[str, float]:
    """Seconds per unit (setup, call and teardown: what a JUnit testcase's time holds), rounded up to the second."""
    seconds: Counter[str] = Counter()
    for case in ET.parse(junit).getroot().iter("testcase"):
        path = case.get("classname", "").replace(".", "/") + ".py"
        seconds[unit_of(path)] += float(case.get("time") or 0)
    return {unit: float(int(s) + 1) for unit, s in sorted(seconds.items(), key=lambda kv: -kv[1])}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: test_durations.py JUNIT_XML")
    table = unit_seconds(Path(sys.argv[1]))
    out = REPO / "tests" / "durations.json"
    out.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{out}: {len(table)} units, {sum(table.values()):.0f} s in all")
