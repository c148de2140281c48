#!/usr/bin/env python3
"""Build the demo traces (traces/demo.jsonl) and the strict production schemas (schemas/<tool>.json).

Small agent sessions for replay through a small embedded model (SmolLM2-135M-Instruct): short tool lists,
short descriptions, and user turns that spell out every argument value so a 135M model can copy them. The
tools simplify BFCL's multi-turn APIs (ticket, file system, trading, travel, vehicle, messaging). Requests
carry loose parameter schemas, as agents usually send; schemas/ holds the stricter production schemas
(enums, bounds, patterns, no extra properties). Every recorded response is the production answer: one tool
call that validates against its schema file. The work is done in scripts/tracegen/ (demo_tools, demo_turns,
demo_sessions).

Standard library only; seeded with random.Random(7), so reruns are byte-identical.

    python scripts/make_demo_traces.py [--out-dir traces] [--schemas-dir schemas]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # loaded by file location (tests) rather than run as a script
    sys.path.insert(0, str(HERE))

from tracegen.demo_sessions import PROMPT_CHAR_BUDGET, build, prompt_chars  # noqa: E402
from tracegen.demo_tools import strict_schema  # noqa: E402
from tracegen.files import write_json, write_jsonl  # noqa: E402

REPO = HERE.parent
__all__ = ["PROMPT_CHAR_BUDGET", "main", "prompt_chars"]  # tests/ingest/test_trace_files.py checks the demo's prompts


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", type=Path, default=REPO / "traces", help="where demo.jsonl goes")
    parser.add_argument("--schemas-dir", type=Path, default=REPO / "schemas", help="where <tool>.json go")
    ns = parser.parse_args(argv)
    schemas_dir = ns.schemas_dir
    ns.out_dir.mkdir(parents=True, exist_ok=True)
    schemas_dir.mkdir(parents=True, exist_ok=True)
    records = build()
    write_jsonl(ns.out_dir / "demo.jsonl", records)
    used = sorted({t["function"]["name"] for r in records for t in r["request"]["tools"]})
    for name in used:
        write_json(schemas_dir / f"{name}.json", strict_schema(name))
    sessions = {r["request"]["metadata"]["session_id"] for r in records}
    print(
        f"{len(sessions)} sessions, {len(records)} calls, {len(used)} tools -> {ns.out_dir / 'demo.jsonl'}, "
        f"{schemas_dir}"
    )


if __name__ == "__main__":
    main()
