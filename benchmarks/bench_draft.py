"""Draft-model speculation with early-exit self-drafts (`smollm2-135m:firstN`) on the embedded engine.

    /work/main/.venv/bin/python benchmarks/bench_draft.py [--calls 24] [--layers 4,8,12] [--k 3] [--k8 5]

On the first N calls of traces/demo.jsonl, per dtype (float32, bfloat16 with the numerics `auto` picks here):
the target path, then one draft_model path per draft depth (k proposals per pass; `--k8` adds a second k for
the 8-layer draft), all in ONE process side by side (the machine is shared: separate runs do not compare).
Every path runs with the prefix cache off, so each pays its own prefill and none profits from another's.
Columns: acceptance (accepted / drafted proposals), tokens per verification pass, completion tokens/s over
the path's wall time, and drift against the same dtype's target (calls whose token ids differ; float32 should
be 0: greedy speculation is exact up to float32 rounding). Drafts are derived into the cache on first use.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def load_requests(n: int):
    from toolaudit.engines.base import EngineRequest

    rows = [json.loads(line) for line in (ROOT / "traces" / "demo.jsonl").read_text().splitlines() if line.strip()]
    return [EngineRequest(key=f"demo-{i}", messages=r["request"]["messages"], tools=r["request"].get("tools", []))
            for i, r in enumerate(rows[:n])]


def run(path, requests):
    from toolaudit.engines.torch.engine import TorchEngine

    engine = TorchEngine(path)
    engine.load()
    start = time.perf_counter()
    results = engine.generate(requests)
    wall = time.perf_counter() - start
    engine.close()
    errors = [r.error for r in results if r.error]
    if errors:
        raise SystemExit(f"{path.name}: {errors[0]}")
    return results, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=24)
    parser.add_argument("--layers", default="4,8,12")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--k8", type=int, default=5, help="a second k for the 8-layer draft (0: none)")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--threads", type=int, help="torch threads of every path (the `threads` key; default: the "
                        "cores the process may use; 1 is faster while other jobs share the cores)")
    args = parser.parse_args()

    import torch

    from toolaudit.engines.models import draft_model
    from toolaudit.engines.paths import SpeculativeConfig, builtin_paths

    requests = load_requests(args.calls)
    layers = [int(x) for x in args.layers.split(",")]
    drafts = [(n, args.k) for n in layers] + ([(8, args.k8)] if args.k8 and 8 in layers else [])
    for n in layers:
        draft_model("smollm2-135m", n)  # derive outside the timed runs
    base = replace(builtin_paths()["target"], batch_size=args.batch, max_tokens=args.max_tokens,
                   prefix_caching=False, options={"threads": args.threads} if args.threads else {})
    print(f"{len(requests)} demo calls, max_tokens {args.max_tokens}, batch {args.batch}, "
          f"torch {torch.__version__}, {args.threads or torch.get_num_threads()} threads\n")
    print("| dtype | path | acceptance | tokens/pass | tokens/s | wall s | drift vs target |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for dtype in args.dtypes.split(","):
        target = replace(base, dtype=dtype)
        ref, wall = run(target, requests)
        tokens = sum(r.completion_tokens for r in ref)
        print(f"| {dtype} | target | - | 1.00 | {tokens / wall:.1f} | {wall:.1f} | - |", flush=True)
        for n, k in drafts:
            path = replace(target, name=f"draft{n}-k{k}", speculative=SpeculativeConfig(
                method="draft_model", model=f"smollm2-135m:first{n}", num_speculative_tokens=k))
            out, wall = run(path, requests)
            drafted = sum(r.drafted_tokens for r in out)
            accepted = sum(r.accepted_tokens for r in out)
            passes = sum(r.forward_passes for r in out)
            toks = sum(r.completion_tokens for r in out)
            drift = sum(a.token_ids != b.token_ids for a, b in zip(ref, out))
            print(f"| {dtype} | first{n}, k={k} | {accepted / max(drafted, 1):.1%} | {toks / max(passes, 1):.2f} | "
                  f"{toks / wall:.1f} | {wall:.1f} | {drift}/{len(out)} |", flush=True)


if __name__ == "__main__":
    main()
