"""Batch invariance (`batch_invariant = true`): the batching noise it removes, the drift it leaves, what it costs.

    .venv/bin/python benchmarks/bench_invariance.py [--prompts 48] [--dtype bfloat16] [--numerics auto]
                                                    [--device cpu] [--json out.json]

All in one process, on the first N demo calls (whole sessions, as a replay sees them), one configuration after
another (each timed; the first run of each model pays its load outside the timing):

  target b16 vs target b1                  the batching noise floor of the default kernels
  target b16 vs spec-ngram b16             speculation's drift on the default kernels
  the same two with batch_invariant = true the floor it leaves (must be 0) and speculation's own drift

Calls are counted as differing when their token ids differ (stricter than tool-call drift: any token).
Cost: tokens/s of each invariant configuration against the same configuration on the default kernels.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--numerics", default="auto")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from benchmarks.bench_engine import load_requests
    from toolaudit.engines.paths import builtin_paths
    from toolaudit.engines.torch.engine import TorchEngine
    from toolaudit.engines.torch.numerics import cpu_capability

    requests = load_requests(args.prompts, "sessions")
    base = builtin_paths()
    options = {} if args.dtype == "float32" else {"numerics": args.numerics}

    def path(name: str, batch: int, invariant: bool):
        p = base[name]
        extra = {"batch_invariant": True} if invariant else {}
        if args.device.startswith("cuda"):
            extra["max_batch"] = batch
        return replace(p, dtype=args.dtype, device=args.device, batch_size=batch, max_tokens=args.max_tokens,
                       options={**p.options, **options, **extra})

    runs: dict[str, dict] = {}
    for invariant in (False, True):
        tag = "-invariant" if invariant else ""
        for name, batch in (("target", 16), ("target", 1), ("spec-ngram", 16)):
            engine = TorchEngine(path(name, batch, invariant))
            engine.load()
            start = time.perf_counter()
            results = engine.generate(requests)
            seconds = time.perf_counter() - start
            errors = [r.error for r in results if r.error]
            if errors:
                raise SystemExit(f"{name}-b{batch}{tag}: {errors[0]}")
            tokens = sum(len(r.token_ids) for r in results)
            key = f"{name}-b{batch}{tag}"
            runs[key] = {"seconds": round(seconds, 2), "tokens": tokens, "tok_per_s": round(tokens / seconds, 1),
                         "outputs": [r.token_ids for r in results], "numerics": engine.numerics}
            print(f"  {key:28s} {seconds:7.1f} s  {tokens / seconds:7.1f} tok/s", file=sys.stderr)
            engine.close()

    def differ(a: str, b: str) -> int:
        return sum(x != y for x, y in zip(runs[a]["outputs"], runs[b]["outputs"]))

    rows = []
    for tag in ("", "-invariant"):
        rows.append({"kernels": "invariant" if tag else "default",
                     "batch_noise": differ(f"target-b16{tag}", f"target-b1{tag}"),
                     "speculation": differ(f"target-b16{tag}", f"spec-ngram-b16{tag}"),
                     **{f"{k}_tok_per_s": runs[f"{k}{tag}"]["tok_per_s"]
                        for k in ("target-b16", "target-b1", "spec-ngram-b16")}})
    cost = {k: round(runs[f"{k}-invariant"]["tok_per_s"] / runs[k]["tok_per_s"], 2)
            for k in ("target-b16", "target-b1", "spec-ngram-b16")}
    numerics = runs["target-b16"]["numerics"]
    print(f"\n{len(requests)} demo calls, {args.dtype} ({numerics}) on {args.device} ({cpu_capability()}), "
          f"max_tokens {args.max_tokens}; calls whose tokens differ:")
    print(f"{'kernels':10s} {'b16 vs b1':>10s} {'target vs spec':>15s} {'target b16':>11s} {'target b1':>10s} "
          f"{'spec b16':>9s}  (tok/s)")
    for r in rows:
        print(f"{r['kernels']:10s} {r['batch_noise']:>10d} {r['speculation']:>15d} {r['target-b16_tok_per_s']:>11.1f} "
              f"{r['target-b1_tok_per_s']:>10.1f} {r['spec-ngram-b16_tok_per_s']:>9.1f}")
    print("invariant / default tokens/s: " + ", ".join(f"{k} {v}x" for k, v in cost.items()))
    if args.json:
        args.json.write_text(json.dumps({"prompts": len(requests), "dtype": args.dtype, "numerics": numerics,
                                         "device": args.device, "cpu": cpu_capability(), "rows": rows,
                                         "cost": cost}, indent=2))


if __name__ == "__main__":
    main()
