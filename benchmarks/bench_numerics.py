"""Is emulated bf16 ("bf16 on fp32 kernels") faithful to native bf16? Drift, margins, agreement and speed.

    .venv/bin/python benchmarks/bench_numerics.py --calls 24 [--configs native,emulated,float32] [--json out.json]

The first N calls of traces/demo.jsonl (whole sessions, as a replay sees them) go through the two built-in
paths, `target` and `spec-ngram`, once per numerics configuration:
  native     bf16 on the CPU's bf16 kernels (`numerics = "native"`; only fast with AVX512-BF16 or AMX)
  emulated   bf16 numerics on float32 kernels (`numerics = "emulated"`, what `auto` picks on AVX2-only CPUs)
  float32    the float32 reference (no bf16 rounding at all)
For each configuration: tokens/s of each path (decode only: the prompts are prefilled once first, untimed in
the path figures, so target and spec-ngram pay the same), drifted calls between target and spec-ngram (tool
calls compared as `toolaudit replay` does), the positions of first divergence and the top-1 - top-2 logit
margins there; then, per path, how often emulated (and float32) outputs equal native ones.

Drift itself is rare and chaotic, so its counts on a few dozen calls are noisy. The mechanism behind it is
not: the same tokens give slightly different logits in a one-token step and in a 6-wide verification pass.
`--noise-calls N` (default 6, 0 to skip) measures that directly: greedy-decode 36 tokens of N calls one step
at a time, replay them in 6-wide passes from the same prompt cache, and compare the logits position by
position. A faithful emulation shows native's noise, float32 almost none. `--calls 0` runs only that.
Everything runs in ONE process, configuration after configuration (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONFIGS = {"native": ("bfloat16", "native"), "emulated": ("bfloat16", "emulated"), "float32": ("float32", "native")}
BF16_STEP = 0.125  # one bf16 step for logits in [16, 32): margins at or below it are near-ties


def load_requests(n: int):
    from toolaudit.engines.base import EngineRequest

    rows = [json.loads(line) for line in (ROOT / "traces" / "demo.jsonl").read_text().splitlines() if line.strip()]
    return [EngineRequest(key=f"demo-{i}", messages=r["request"]["messages"], tools=r["request"].get("tools", []))
            for i, r in enumerate(rows[:n])]


def run_config(name: str, requests, args) -> dict:
    """Prefill every prompt once (into the model's prefix cache), then time target and spec-ngram."""
    from toolaudit.engines import make_engine
    from toolaudit.engines.paths import builtin_paths

    dtype, numerics = CONFIGS[name]
    options = {"numerics": numerics, **({"threads": args.threads} if args.threads else {})}
    paths = {k: replace(p, dtype=dtype, batch_size=args.batch_size, max_tokens=args.max_tokens, options=options)
             for k, p in builtin_paths().items()}
    warm = make_engine(replace(paths["target"], max_tokens=1))
    start = time.perf_counter()
    warm.generate(requests)
    prefill_s = time.perf_counter() - start
    out = {"numerics": warm.numerics, "dtype": dtype, "prefill_s": prefill_s, "paths": {}}
    for key in ("target", "spec-ngram"):
        engine = make_engine(paths[key])
        start = time.perf_counter()
        results = engine.generate(requests)
        seconds = time.perf_counter() - start
        errors = [r.error for r in results if r.error]
        if errors:
            raise RuntimeError(f"{name} {key}: {errors[0]}")
        tokens = sum(len(r.token_ids) for r in results)
        drafted = sum(r.drafted_tokens for r in results)
        out["paths"][key] = {
            "seconds": seconds, "tokens": tokens, "tok_per_s": tokens / seconds,
            "acceptance": sum(r.accepted_tokens for r in results) / drafted if drafted else None,
            "results": results,
        }
        print(f"  {name:9s} {key:10s} {seconds:7.1f} s  {tokens / seconds:6.1f} tok/s", file=sys.stderr)
    out["drift"] = drift(out["paths"]["target"]["results"], out["paths"]["spec-ngram"]["results"])
    return out


def shape_noise(name: str, requests, tokens: int = 36, width: int = 6) -> dict:
    """Logits of one-token steps vs `width`-wide passes over the same tokens (see the module docstring)."""
    import torch

    from toolaudit.engines.paths import builtin_paths
    from toolaudit.engines.prompting import render
    from toolaudit.engines.torch.kv import KVBatch
    from toolaudit.engines.torch.models import load_model
    from toolaudit.engines.torch.numerics import resolve

    dtype, numerics = CONFIGS[name]
    model, tokenizer = load_model("smollm2-135m", dtype, "cpu", resolve(dtype, "cpu", numerics))
    prompt = builtin_paths()["target"].prompt
    identical = flipped = positions = 0
    gaps = []
    with torch.inference_mode():
        for req in requests:
            ids = tokenizer(render(tokenizer, req.messages, req.tools, prompt).text, add_special_tokens=False)
            ids = ids["input_ids"]
            kv = KVBatch(model)
            chosen, steps = [int(kv.admit([ids])[0].argmax())], []
            for _ in range(tokens):
                steps.append(kv.extend([[chosen[-1]]])[0, -1].float())
                chosen.append(int(steps[-1].argmax()))
            kv = KVBatch(model)
            kv.admit([ids])
            wide = torch.cat([kv.extend([chosen[s:s + width]])[0].float() for s in range(0, tokens, width)])
            step = torch.stack(steps)
            identical += int((step == wide).all(-1).sum())
            flipped += int((step.argmax(-1) != wide.argmax(-1)).sum())
            positions += len(step)
            gaps.append((step - wide).abs().max(-1).values)
    gap = torch.cat(gaps)
    return {"positions": positions, "identical": identical, "argmax_flips": flipped,
            "median_max_gap": float(gap.median()), "mean_max_gap": float(gap.mean())}


def drift(base, cand) -> dict:
    """Drifted calls (tool calls differ, as `toolaudit replay` judges them), differing token streams, and the
    first divergence of each differing call: position and both paths' margins there."""
    from toolaudit.compare.diff import diff_outputs
    from toolaudit.validate.toolcalls import parse_text

    kinds: dict[str, int] = {}
    positions, margins = [], []
    differ = 0
    for a, b in zip(base, cand):
        verdict = diff_outputs(parse_text(a.text), parse_text(b.text), lambda c: None, lambda c: None,
                               a.text == b.text)
        if verdict.kind.drifted:
            kinds[verdict.kind.value] = kinds.get(verdict.kind.value, 0) + 1
        if a.token_ids != b.token_ids:
            differ += 1
            n = min(len(a.token_ids), len(b.token_ids))
            pos = next((i for i in range(n) if a.token_ids[i] != b.token_ids[i]), n)
            positions.append(pos)
            if pos < len(a.margins):
                margins.append(a.margins[pos])
    return {"calls": len(base), "drifted": sum(kinds.values()), "kinds": kinds, "token_differ": differ,
            "positions": positions, "margins": margins}


def agreement(ref, other) -> dict:
    """How often `other` (emulated or float32) reproduces `ref` (native) for one path."""
    same_tokens = sum(a.token_ids == b.token_ids for a, b in zip(ref, other))
    same_text = sum(a.text == b.text for a, b in zip(ref, other))
    firsts = []
    for a, b in zip(ref, other):
        if a.token_ids != b.token_ids:
            n = min(len(a.token_ids), len(b.token_ids))
            firsts.append(next((i for i in range(n) if a.token_ids[i] != b.token_ids[i]), n))
    return {"calls": len(ref), "same_tokens": same_tokens, "same_text": same_text, "first_differences": firsts}


def quartiles(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) < 4:
        return "/".join(f"{v:.3g}" for v in sorted(values))
    q = statistics.quantiles(values, n=4)
    return f"{q[0]:.3g}/{statistics.median(values):.3g}/{q[2]:.3g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=24)
    parser.add_argument("--configs", default="native,emulated,float32")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: the engine's: all cores)")
    parser.add_argument("--noise-calls", type=int, default=6)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import torch

    from toolaudit.engines.torch.numerics import cpu_capability, has_native

    names = [c for c in args.configs.split(",") if c]
    unknown = set(names) - set(CONFIGS)
    if unknown:
        parser.error(f"unknown configuration(s) {', '.join(sorted(unknown))}; choose from {', '.join(CONFIGS)}")
    requests = load_requests(args.calls)
    capability = cpu_capability()
    print(f"CPU capability {capability} (native bf16 matmul: {has_native('bfloat16', 'cpu')}), "
          f"torch {torch.__version__}", file=sys.stderr)
    runs = {name: run_config(name, requests, args) for name in names} if requests else {}
    if args.threads:
        torch.set_num_threads(args.threads)
    noise = {name: shape_noise(name, load_requests(args.noise_calls)) for name in names} if args.noise_calls else {}
    report(runs, args, capability, torch.get_num_threads())
    report_noise(noise, args.noise_calls)
    if args.json:
        for run in runs.values():
            for path in run["paths"].values():
                path.pop("results")
        args.json.write_text(json.dumps({"cpu_capability": capability, "calls": len(requests),
                                         "max_tokens": args.max_tokens, "runs": runs, "noise": noise}, indent=2))


def report_noise(noise: dict, calls: int) -> None:
    if not noise:
        return
    print(f"\nOne-token steps vs 6-wide passes over the same 36 tokens of {calls} calls (batch 1):")
    print("\n| numerics | positions | logits bit-identical | argmax differs | max abs logit difference per position, "
          "median / mean |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, n in noise.items():
        print(f"| {name} | {n['positions']} | {n['identical']} | {n['argmax_flips']} | "
              f"{n['median_max_gap']:.4f} / {n['mean_max_gap']:.4f} |")


def report(runs: dict, args, capability: str, threads: int) -> None:
    if not runs:
        return
    calls = next(iter(runs.values()))["drift"]["calls"]
    print(f"\nCPU capability {capability}; {calls} demo calls, max_tokens {args.max_tokens}, batch "
          f"{args.batch_size}, {threads} threads, load average {os.getloadavg()[0]:.1f}")
    print("\n| numerics | prefill s | target tok/s | spec-ngram tok/s | acceptance | drifted calls | token streams "
          "differ | first divergence (positions) | margin there q1/median/q3 | margins <= 1 bf16 step |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |")
    for name, run in runs.items():
        d, p = run["drift"], run["paths"]
        kinds = ", ".join(f"{v} {k}" for k, v in sorted(d["kinds"].items()))
        near = sum(m <= BF16_STEP for m in d["margins"])
        print(f"| {name} ({run['dtype']}, {run['numerics']}) | {run['prefill_s']:.1f} | "
              f"{p['target']['tok_per_s']:.1f} | {p['spec-ngram']['tok_per_s']:.1f} | "
              f"{p['spec-ngram']['acceptance']:.1%} | {d['drifted']}/{d['calls']}{f' ({kinds})' if kinds else ''} | "
              f"{d['token_differ']}/{d['calls']} | {sorted(d['positions'])} | {quartiles(d['margins'])} | "
              f"{near}/{len(d['margins'])} |")
    if "native" not in runs:
        return
    print("\n| vs native bf16 | path | identical tokens | identical text | first difference at (positions) |")
    print("| --- | --- | ---: | ---: | --- |")
    for name, run in runs.items():
        if name == "native":
            continue
        for key in ("target", "spec-ngram"):
            a = agreement(runs["native"]["paths"][key]["results"], run["paths"][key]["results"])
            print(f"| {name} | {key} | {a['same_tokens']}/{a['calls']} | {a['same_text']}/{a['calls']} | "
                  f"{sorted(a['first_differences'])} |")


if __name__ == "__main__":
    main()
