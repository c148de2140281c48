"""`toolaudit serve` under load: many requests in flight through the real openai client, none lost or duplicated.

    python benchmarks/bench_serve.py                         # tiny random model, 320 calls, 32 in flight
    python benchmarks/bench_serve.py --batch-size 1          # the same without server-side batching
    python benchmarks/bench_serve.py --threads 0             # torch's default thread count in the server
    python benchmarks/bench_serve.py --model smollm2-135m -n 64 --max-tokens 8    # the real model (slow on CPU)

Starts the server as a subprocess on a free loopback port around one embedded path (float32), replays the demo
traces' requests (cycled to N, each with its own X-Request-Id, which the server uses as the completion id), and
checks: every request answered exactly once with its own id, no errors, and the server's counters moved by
exactly N requests (no duplicate engine work). Prints throughput, p50/p99 latency and the mean engine batch.
The default model is a 2-layer random Llama over SmolLM2's tokenizer (tiny_model below), so the figures measure
the HTTP path, batching and per-step engine overhead, not a real model's arithmetic.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from toolaudit.replay.replayer import ReplayOptions, load_calls  # noqa: E402


def tiny_model(out: Path) -> Path:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from toolaudit.engines.models import converted_dir, resolve

    tokenizer = AutoTokenizer.from_pretrained(converted_dir(resolve("smollm2-135m")))
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def metrics(root: str) -> dict[str, float]:
    with urllib.request.urlopen(root + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name.split("{")[0]] = out.get(name.split("{")[0], 0.0) + float(value)
    return out


def start_server(paths: Path, log: Path, threads: int) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "toolaudit", "serve", "--paths", str(paths), "--path",
                                 "bench", "--port", "0"], env=env, stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"serve exited: {log.read_text()}")
        text = log.read_text()
        if "ready (" in text:
            base = text.split("listening on ", 1)[1].split()[0]
            return proc, base
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("serve did not get ready in 300 s")


async def fire(base: str, model: str, calls, n: int, in_flight: int, max_tokens: int, prefix: str):
    import openai

    client = openai.AsyncOpenAI(api_key="EMPTY", base_url=base, max_retries=0, timeout=600)
    slots = asyncio.Semaphore(in_flight)
    state = {"now": 0, "peak": 0}
    latencies: list[float] = []
    answers: list[tuple[str, str, int]] = []  # (request id, completion id, completion tokens)
    errors: list[str] = []

    async def one(i: int) -> None:
        call = calls[i % len(calls)]
        rid = f"{prefix}-{i}"
        async with slots:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
            t0 = time.perf_counter()
            try:
                r = await client.chat.completions.create(
                    model=model, messages=call.request["messages"], tools=call.tools, max_tokens=max_tokens,
                    temperature=0, extra_headers={"X-Request-Id": rid})
                latencies.append(time.perf_counter() - t0)
                answers.append((rid, r.id, r.usage.completion_tokens))
            except Exception as exc:  # noqa: BLE001 -- counted and reported
                errors.append(f"{rid}: {type(exc).__name__}: {exc}")
            finally:
                state["now"] -= 1

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    wall = time.perf_counter() - t0
    await client.close()
    return wall, latencies, answers, errors, state["peak"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=320, help="requests to send (default 320)")
    ap.add_argument("--in-flight", type=int, default=32, help="requests in flight (default 32)")
    ap.add_argument("--batch-size", type=int, default=8, help="server path batch_size (default 8)")
    ap.add_argument("--max-tokens", type=int, default=12, help="max_tokens per request (default 12)")
    ap.add_argument("--model", help="model spec (default: a tiny random Llama built in a temp dir)")
    ap.add_argument("--warmup", type=int, default=16, help="uncounted warm-up requests (default 16)")
    ap.add_argument("--threads", type=int, default=1,
                    help="server torch threads (OMP_NUM_THREADS; default 1, 0 = torch's default)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = args.model or str(tiny_model(tmp / "tiny"))
        paths = tmp / "paths.toml"
        paths.write_text(f'[paths.bench]\nengine = "torch"\nmodel = "{model}"\ndtype = "float32"\n'
                         f"batch_size = {args.batch_size}\nmax_tokens = {args.max_tokens}\n")
        calls, _, _ = load_calls(ReplayOptions(traces=[str(ROOT / "traces" / "demo.jsonl")]))
        proc, base = start_server(paths, tmp / "serve.log", args.threads)
        root = base.removesuffix("/v1")
        try:
            asyncio.run(fire(base, "bench", calls, args.warmup, args.in_flight, args.max_tokens, "warmup"))
            before = metrics(root)
            wall, lat, answers, errors, peak = asyncio.run(
                fire(base, "bench", calls, args.n, args.in_flight, args.max_tokens, "bench"))
            after = metrics(root)
        finally:
            proc.terminate()
            proc.wait(timeout=30)

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    ids = [rid for rid, _, _ in answers]
    lost = args.n - len(set(ids)) - len(errors)
    duplicated = len(ids) - len(set(ids))
    wrong_id = sum(1 for rid, cid, _ in answers if cid != f"chatcmpl-{rid}")
    tokens = sum(t for _, _, t in answers)
    engine_requests, batches = delta("toolaudit:engine_batch_requests_total"), delta("toolaudit:engine_batches_total")
    q = statistics.quantiles(lat, n=100) if len(lat) > 1 else [lat[0]] * 99
    print(f"model            {'tiny random Llama (2 layers, hidden 32)' if not args.model else args.model}, "
          f"float32, max_tokens {args.max_tokens}, server batch_size {args.batch_size}, "
          f"torch threads {args.threads or 'default'}")
    print(f"requests         {args.n} sent, {len(answers)} answered, {len(errors)} errors, {lost} lost, "
          f"{duplicated} duplicated, {wrong_id} with another request's id")
    print(f"in flight        peak {peak} (limit {args.in_flight})")
    print(f"server counters  {delta('vllm:request_success_total'):.0f} requests, {engine_requests:.0f} engine "
          f"requests in {batches:.0f} engine calls (mean batch {engine_requests / max(batches, 1):.2f}), "
          f"{delta('vllm:generation_tokens_total'):.0f} tokens (client saw {tokens})")
    print(f"throughput       {len(answers) / wall:.1f} req/s, {tokens / wall:.1f} generated tok/s "
          f"({wall:.2f} s wall)")
    print(f"latency          p50 {q[49] * 1000:.0f} ms, p99 {q[98] * 1000:.0f} ms, max {max(lat) * 1000:.0f} ms")
    ok = (not errors and lost == 0 and duplicated == 0 and wrong_id == 0 and engine_requests == args.n
          and delta("vllm:request_success_total") == args.n and delta("vllm:generation_tokens_total") == tokens)
    for e in errors[:5]:
        print("error:", e)
    print("OK: every request answered once, with its own id" if ok else "FAILED: see above")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
