"""The demo on a stand-in for a 2-core AVX2-only CPU: AVX2 kernels on ONE core of a faster CPU.

Why a stand-in: the issue's AVX2-only machine was not available, and AVX2 kernels on this CPU's two cores do about
twice its float32 arithmetic (the demo is mostly arithmetic: prompt prefill and verification passes). One core
running torch's, MKL's and oneDNN's AVX2 code comes close in arithmetic and is slower in memory traffic and
per-op overhead. This prints that calibration next to the issue's figures, then times `toolaudit demo
--numerics emulated` (what `auto` picks on an AVX2-only CPU) in that setting. Its replay time is evidence for an
AVX2-only CPU, not a measurement on one.

    python benchmarks/bench_avx2_proxy.py [--core 0] [--skip-demo]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

AVX2_KERNELS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
# Measured on the issue's 2-core AVX2-only machine (torch 2.13): per thread, 1024x1024 float32 matmul; one thread,
# SmolLM2's LM-head product for one token (576 x 49152, float32), which is bound by memory bandwidth.
ISSUE_GFLOPS_PER_THREAD, ISSUE_LM_HEAD_MS = 47.0, 6.0

# Run in a child process: the kernel variables must be set before torch loads.
CALIBRATION = """
import torch
from bench_gemm import timed
torch.set_num_threads(1)
a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
w, x = torch.randn(49152, 576), torch.randn(1, 576)
print(torch.backends.cpu.get_cpu_capability(), 2 * 1024 ** 3 / timed(lambda: a @ b, 1.0) / 1e6,
      timed(lambda: torch.nn.functional.linear(x, w), 1.0))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--core", type=int, default=0, help="The one core to run on.")
    parser.add_argument("--skip-demo", action="store_true", help="Print the calibration only.")
    args = parser.parse_args()
    env = {**os.environ, **AVX2_KERNELS}
    pin = ["taskset", "-c", str(args.core)]
    cap, gflops, lm_head_ms = subprocess.run([*pin, sys.executable, "-c", CALIBRATION], env=env, check=True,
                                             capture_output=True, text=True, cwd=Path(__file__).parent
                                             ).stdout.split()
    gflops, lm_head_ms = float(gflops), float(lm_head_ms)
    print(f"stand-in: one core, kernels {cap}")
    print(f"  float32 1024 matmul  {gflops:6.1f} GFLOP/s   the issue's 2 cores: {2 * ISSUE_GFLOPS_PER_THREAD:.0f} "
          f"GFLOP/s (stand-in {gflops / (2 * ISSUE_GFLOPS_PER_THREAD):.2f}x)")
    print(f"  LM-head product       {lm_head_ms:6.2f} ms        the issue's one thread: {ISSUE_LM_HEAD_MS:.1f} ms "
          f"(stand-in {ISSUE_LM_HEAD_MS / lm_head_ms:.2f}x as fast)")
    if args.skip_demo:
        return
    toolaudit = Path(sys.executable).with_name("toolaudit")
    with tempfile.TemporaryDirectory() as tmp:
        demo = [*pin, str(toolaudit), "demo", "--numerics", "emulated", "--db", str(Path(tmp) / "demo.duckdb")]
        print("$", " ".join(demo), flush=True)
        sys.exit(subprocess.run(demo, env=env).returncode)


if __name__ == "__main__":
    main()
