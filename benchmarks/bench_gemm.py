"""Linears of SmolLM2-135M's shapes: torch's default kernel vs prepacked oneDNN, side by side.

Emulated bf16 (float32 weights) and native bf16 run their linears on prepacked oneDNN weights
(`toolaudit/engines/torch/gemm.py`); this prints why, on the CPU at hand: ms per product for the row counts
decoding uses (1: batch-1 step, 16: a 16-row step, 96: a 16 x 6 verification pass, 600: a prompt) and the
largest difference between the two kernels' outputs. Set ATEN_CPU_CAPABILITY=avx2
MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 to run the kernels an AVX2-only CPU runs.

    python benchmarks/bench_gemm.py [--threads N] [--dtype float32|bfloat16]
"""

from __future__ import annotations

import argparse
import functools
import time

import torch
import torch.nn.functional as F

from toolaudit.engines.torch import gemm

SHAPES = {"q/o proj": (576, 576), "gate/up proj": (1536, 576), "down proj": (576, 1536), "LM head": (49152, 576)}
ROWS = (1, 16, 96, 600)


def timed(fn, seconds: float = 0.3) -> float:
    """Best-of-3 mean milliseconds per call."""
    fn()
    best = float("inf")
    for _ in range(3):
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds / 3:
            fn()
            n += 1
        best = min(best, (time.perf_counter() - start) / n * 1e3)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="float32: emulated numerics' linears; bfloat16: native bf16's")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if not gemm.prepacking_available():
        raise SystemExit("this torch build has no oneDNN prepacked linear")
    dtype = getattr(torch, args.dtype)
    print(f"CPU capability {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads, {args.dtype}")
    print(f"{'linear':<14}{'rows':>6}{'aten ms':>10}{'oneDNN ms':>11}{'ratio':>8}{'max |diff|':>12}")
    with torch.inference_mode():
        for name, (out_features, in_features) in SHAPES.items():
            weight = (torch.randn(out_features, in_features) * in_features ** -0.5).to(dtype)
            packed = gemm.pack(weight)
            for rows in ROWS:
                x = torch.randn(rows, in_features).to(dtype)
                aten = timed(functools.partial(F.linear, x, weight))
                dnn = timed(functools.partial(gemm.linear, x, packed))
                diff = (F.linear(x, weight) - gemm.linear(x, packed)).abs().max().item()
                print(f"{name:<14}{rows:>6}{aten:>10.3f}{dnn:>11.3f}{aten / dnn:>7.2f}x{diff:>12.2e}")


if __name__ == "__main__":
    main()
