#!/usr/bin/env python
"""Write toolaudit/replay/probe_set.jsonl, the bundled probe set, from the demo's traces.

Candidates: the first call of every demo session (68: system prompt, user request, the request's tools; later
calls carry whole conversations, long prompts that make a probe slow). Each is decoded as a probe decodes it
(`probe.probe_path`: greedy, 16 tokens, no few-shot examples) on the demo's baseline path (`target`, bf16), and
the set keeps the NEAR_TIES candidates whose smallest top-1 minus top-2 logprob margin is smallest (where a
runtime change flips an argmax first) and SPREAD others evenly over the rest (ordinary decisions, every customer).
Prints the margins it chose by. Run from the repository root: python scripts/make_probe_set.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from toolaudit.engines import EngineRequest, make_engine  # noqa: E402
from toolaudit.engines.paths import load_paths  # noqa: E402
from toolaudit.replay.probe import probe_path  # noqa: E402
from toolaudit.replay.probe_set import BUNDLED, DEFAULT_MAX_TOKENS, TOP_K  # noqa: E402

NEAR_TIES, SPREAD = 16, 16


def main() -> None:
    records = [json.loads(line) for line in (ROOT / "traces" / "demo.jsonl").read_text().splitlines()]
    firsts = [r["request"] for r in records if r["request"]["metadata"].get("call_index") == "0"]
    prompts = [{"messages": r["messages"], "tools": r["tools"], "max_tokens": DEFAULT_MAX_TOKENS} for r in firsts]
    engine = make_engine(probe_path(load_paths()["target"], DEFAULT_MAX_TOKENS))
    t0 = time.perf_counter()
    results = engine.generate([EngineRequest(f"c{i}", p["messages"], p["tools"], logprobs=TOP_K)
                               for i, p in enumerate(prompts)])
    print(f"decoded {len(prompts)} candidates in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    failed = [r.error for r in results if r.error]
    if failed:
        raise SystemExit(f"{len(failed)} candidates failed: {failed[0]}")
    margins = [min(r.margins) for r in results]
    order = sorted(range(len(prompts)), key=lambda i: margins[i])
    near = order[:NEAR_TIES]
    rest = order[NEAR_TIES:]
    step = len(rest) / SPREAD
    spread = [rest[int(k * step)] for k in range(SPREAD)]
    chosen = sorted(near + spread)
    with BUNDLED.open("w") as fh:
        for i in chosen:
            fh.write(json.dumps(prompts[i], separators=(",", ":")) + "\n")
    print(f"wrote {len(chosen)} prompts to {BUNDLED.relative_to(ROOT)}; near-tie margins: "
          + ", ".join(f"{margins[i]:.4f}" for i in near), file=sys.stderr)
    print("other prompts' smallest margins: " + ", ".join(f"{margins[i]:.3f}" for i in spread), file=sys.stderr)


if __name__ == "__main__":
    main()
