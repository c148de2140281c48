"""Samples per second of a sampled replay: N samples of one call decoded as rows of one batch (the prompt's
prefill computed once, through the prefix cache, the rows stepping together) against the same N samples as N
independent requests on the same engine (one `generate` call each, batch 1; the prefix cache is warm for both,
as a server's would be).

    .venv/bin/python benchmarks/bench_samples.py [--samples 16] [--calls 4] [--paths target,spec-ngram]
        [--dtype bfloat16] [--temperature 0.7] [--rounds 2]

Both ways run side by side in ONE process, in rotating order, `--rounds` times (the fastest round counts). Each
way gets the same requests (sample i seeded by the call key and i), so both decode the same tokens: the table
checks that too. The goal (issue 34): the batch at least 3x the independent requests at N = 16 on CPU.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from toolaudit.engines import make_engine
from toolaudit.engines.paths import load_paths
from toolaudit.engines.torch.numerics import cpu_capability
from toolaudit.replay.inputs import ReplayOptions, load_calls
from toolaudit.replay.schedules import Schedule


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--calls", type=int, default=4, help="the first call of this many demo sessions")
    ap.add_argument("--paths", default="target,spec-ngram")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    calls = load_calls(ReplayOptions(traces=["traces/demo.jsonl"], limit=a.calls, calls_per_session=1))[0]
    where = f"CPU {cpu_capability()}" if a.device == "cpu" else _gpu_name()
    print(f"{where}; demo calls {len(calls)} (first of each session), N = {a.samples}, {a.dtype}, "
          f"temperature {a.temperature}")
    print(f"{'path':<12} {'way':<26} {'samples':>7} {'tokens':>7} {'seconds':>8} {'samples/s':>9} {'ratio':>6}")
    for name in a.paths.split(","):
        path = replace(load_paths()[name], dtype=a.dtype, temperature=a.temperature, samples=a.samples,
                       batch_size=a.samples, device=a.device)
        engine = make_engine(path)
        engine.load()
        per_call = [Schedule.requests([c], path) for c in calls]
        engine.generate(per_call[0][:2])  # warm: weights, kernels, the calls' prompts in the prefix cache
        for reqs in per_call:
            engine.generate(reqs[:1])
        best: dict[str, tuple[float, int, list]] = {}
        ways = {"one batch of N rows": lambda reqs, e=engine: e.generate(reqs),
                "N independent requests": lambda reqs, e=engine: [r for q in reqs for r in e.generate([q])]}
        for round_no in range(a.rounds):
            for way in (list(ways) if round_no % 2 == 0 else list(ways)[::-1]):
                start = time.perf_counter()
                results = [r for reqs in per_call for r in ways[way](reqs)]
                seconds = time.perf_counter() - start
                tokens = sum(r.completion_tokens for r in results)
                if way not in best or seconds < best[way][0]:
                    best[way] = (seconds, tokens, [r.token_ids for r in results])
        n = sum(len(r) for r in per_call)
        base = best["N independent requests"][0]
        for way, (seconds, tokens, _) in best.items():
            print(f"{name:<12} {way:<26} {n:>7} {tokens:>7} {seconds:>8.1f} {n / seconds:>9.2f} "
                  f"{base / seconds:>5.2f}x")
        same = best["one batch of N rows"][2] == best["N independent requests"][2]
        print(f"{name:<12} same tokens both ways: {same}")
        engine.close()


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0)


if __name__ == "__main__":
    main()
