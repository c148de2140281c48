#!/usr/bin/env python3
"""Build the example canary traces from BFCL: one baseline log, one candidate log, and the expected drifts.

The story: a nightly canary sends the same recorded agent requests to a target-only endpoint (baseline) and
to a speculative-decoding endpoint (candidate). The baseline answers with BFCL's ground truth; the candidate
answers identically except for pure reformattings (not drift), text-only differences, one answer cut at
max_tokens (truncated: not compared) and injected drifts, all recorded in example_expected.json. The work is
done in scripts/tracegen/ (example_sessions, drifts, example_logs).

Standard library only; seeded with random.Random(7), so reruns are byte-identical.

    python scripts/make_example_traces.py [--out-dir traces] [--bfcl-dir ../shared/data/bfcl]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # loaded by file location (tests) rather than run as a script
    sys.path.insert(0, str(HERE))

from tracegen.example_logs import build  # noqa: E402
from tracegen.files import write_json, write_jsonl  # noqa: E402

REPO = HERE.parent
DEFAULT_BFCL = Path(os.environ.get("TOOLAUDIT_BFCL_DIR", REPO.parent / "shared" / "data" / "bfcl"))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", type=Path, default=REPO / "traces", help="where the three files go")
    parser.add_argument("--bfcl-dir", type=Path, default=DEFAULT_BFCL, help="BFCL v4 data directory")
    ns = parser.parse_args(argv)
    ns.out_dir.mkdir(parents=True, exist_ok=True)
    baseline, candidate, expected = build(ns.bfcl_dir)
    write_jsonl(ns.out_dir / "example_baseline.jsonl", baseline)
    write_jsonl(ns.out_dir / "example_candidate.jsonl", candidate)
    write_json(ns.out_dir / "example_expected.json", expected)
    c = expected["counts"]
    print(
        f"{c['sessions_matched']} matched sessions, {c['calls_matched']} matched calls, "
        f"{c['drifted_calls']} drifts, {c['truncated_calls']} truncated, {c['reformatted_calls']} reformatted, "
        f"{c['text_only_calls']} text-only "
        f"-> {ns.out_dir}"
    )


if __name__ == "__main__":
    main()
