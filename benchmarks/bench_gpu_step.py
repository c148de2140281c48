"""Where a batch-1 decode step's time goes on a GPU: kernels per step and device vs host time, per step variant.

    python benchmarks/bench_gpu_step.py [--dtype bfloat16] [--steps 200] [--json out.json]

One row in flight, one prompt of the demo admitted into a fixed-shape `StaticKV` (the CUDA layout), then `--steps`
one-token steps, for: eager (every kernel launched from Python), graphs (the step replayed as a CUDA graph) and
compiled + graphs (`torch.compile`'d step, then captured). Per variant:
- kernels: CUDA kernels one step launches (torch.profiler, one eager or compiled step outside any graph);
- replay ms: the captured graph alone, timed with CUDA events (the device's share of a step);
- extend ms: `StaticKV.extend` as the decode loop calls it (host packing and copies + the step);
- loop ms: what one token costs in `loop.decode` at batch 1 (choice, margins, the host sync included).
The gap between replay and loop is host work that a graph cannot remove.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--device", default="cuda", help="cuda; cpu runs the eager variant only (a smoke test)")
    args = parser.parse_args()

    import torch

    from benchmarks.bench_engine import load_requests
    from toolaudit.engines.paths import builtin_paths
    from toolaudit.engines.prompting import render
    from toolaudit.engines.torch.graphs import StepGraphs
    from toolaudit.engines.torch.loop import DecodeSettings, decode
    from toolaudit.engines.torch.models import load_model
    from toolaudit.engines.torch.static_kv import StaticKV

    device = args.device
    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    model, tokenizer = load_model("smollm2-135m", args.dtype, device, "native")
    request = load_requests(1, "sessions")[0]
    prompt = tokenizer(render(tokenizer, request.messages, request.tools, builtin_paths()["target"].prompt).text,
                       add_special_tokens=False)["input_ids"]
    capacity = len(prompt) + args.steps + 8
    rows = []
    for variant in ("eager", "graphs", "compiled+graphs") if cuda else ("eager",):
        compiled, graphs = variant.startswith("compiled"), variant != "eager"
        kv = StaticKV(model, 1, capacity, fixed=True, width=1, graphs=StepGraphs() if graphs else None,
                      compiled=compiled)
        with torch.inference_mode():
            kv.admit([prompt])
            start = time.perf_counter()
            kv.extend([[prompt[-1]]])  # capture (and compile) here
            sync()
            first = time.perf_counter() - start
            ids = torch.zeros(1, 1, dtype=torch.long, device=device)
            positions = torch.full((1, 1), len(prompt) + 1, device=device)
            kv.cache.aim(0, 1, positions, kv.cache.capacity)
            activity = torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU
            with torch.profiler.profile(activities=[activity]) as prof:
                kv._step(ids, positions, kv.cache.capacity)
                sync()
            # CUDA: kernels launched; CPU (smoke test): aten ops run
            kind = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
            kernels = sum(1 for e in prof.events() if e.device_type == kind and (cuda or e.name.startswith("aten::")))
            replay_ms = None
            if graphs:
                captured = next(iter(kv.graphs._captured.values()))
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                for _ in range(args.steps):
                    captured.graph.replay()
                end.record()
                sync()
                replay_ms = begin.elapsed_time(end) / args.steps
            kv.reset()
            kv.admit([prompt])
            sync()
            start = time.perf_counter()
            for step in range(args.steps):
                kv.extend([[prompt[step % len(prompt)]]])
            sync()
            extend_ms = (time.perf_counter() - start) * 1000 / args.steps

            def new_kv(r, c, w, kv=kv):
                return kv.reset()

            settings = DecodeSettings(max_tokens=args.steps)
            start = time.perf_counter()
            out = decode(model, [prompt], settings, batch_size=1, new_kv=new_kv)[0]
            sync()
            loop_ms = (time.perf_counter() - start) * 1000 / max(1, len(out.token_ids))
        row = {"variant": variant, "kernels_per_step": kernels, "first_step_s": round(first, 2),
               "replay_ms": None if replay_ms is None else round(replay_ms, 3), "extend_ms": round(extend_ms, 3),
               "loop_ms_per_token": round(loop_ms, 3), "loop_tokens": len(out.token_ids),
               "loop_tok_per_s": round(1000 / loop_ms, 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    info = {"gpu": torch.cuda.get_device_name(0) if cuda else None, "torch": torch.__version__,
            "cuda": torch.version.cuda, "dtype": args.dtype, "prompt_tokens": len(prompt), "steps": args.steps}
    print(json.dumps(info))
    if args.json:
        args.json.write_text(json.dumps({"info": info, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
