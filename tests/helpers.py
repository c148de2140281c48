"""Shared test helpers: the one tiny random Llama builder, paths.toml snippets, HTTP calls, a `toolaudit serve`
subprocess on a free loopback port and an in-process aiohttp app. Imported by test modules as `helpers` (tests/
is on sys.path through its conftest); fixtures stay in conftest files. Light to import: torch loads on use.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "traces" / "demo.jsonl"
VOCAB = 300  # the float64 decode tests' vocabulary
MAX_TOKENS = 40  # tokens the decode tests generate per prompt


def tiny_llama(seed: int, vocab: int = VOCAB, head_scale: float = 1.0, base=None, noise: float = 0.0, *,
               hidden: int = 64, heads: int = 4, kv_heads: int = 2, positions: int = 1024, float64: bool = True,
               **config):
    """A 2-layer random Llama (MLP twice as wide as `hidden`), float64 and in eval mode unless `float64=False`.

    `base` + `noise` makes a draft that agrees with `base` most of the time; `head_scale` sharpens the output
    distribution. Extra keyword arguments go to `LlamaConfig` (token ids, tied embeddings)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=positions, **config,
    ))
    if float64:
        model = model.to(torch.float64).eval()
    with torch.no_grad():
        if base is not None:
            for p, q in zip(model.parameters(), base.parameters()):
                p.copy_(q + noise * torch.randn_like(q) * q.std().clamp_min(1e-3))
        else:
            model.lm_head.weight.mul_(head_scale)
    return model


def build_tiny_model(out: Path, echo: bool = False, head_scale: float = 1.0) -> Path:
    """`tiny_llama` over SmolLM2's real tokenizer (float32, 32 wide), saved as a Hugging Face model directory.

    `head_scale` sharpens the output distribution: top logprobs near 0, where a float32 logprob keeps the last
    bits of a logit (near-uniform logprobs of about -10 round away differences under ~1e-6).

    `echo=True`: tied embeddings and silenced attention/MLP outputs, so the model repeats its last token with a
    wide margin: n-gram speculation then drafts and accepts (a random model never repeats an n-gram)."""
    import torch
    from transformers import AutoTokenizer

    from toolaudit.engines.models import converted_dir, resolve

    tokenizer = AutoTokenizer.from_pretrained(converted_dir(resolve("smollm2-135m")))
    model = tiny_llama(0, len(tokenizer), head_scale, hidden=32, heads=2, kv_heads=1, positions=2048,
                       float64=False, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                       tie_word_embeddings=echo)
    if echo:
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def greedy(model, prompts: list[list[int]], settings=None) -> list[list[int]]:
    """Target greedy decoding one prompt at a time: the reference every batched or speculative run must equal."""
    from toolaudit.engines.torch.loop import DecodeSettings, decode

    settings = settings or DecodeSettings(max_tokens=MAX_TOKENS)
    return [decode(model, [p], settings)[0].token_ids for p in prompts]


def torch_path_toml(name: str, model_dir: Path, *, batch_size: int = 1, max_tokens: int = 12,
                    speculative: bool = False, prefix_caching: bool = True, prefill: str | None = None,
                    stop: tuple[str, ...] | None = None) -> str:
    """A torch path on a tiny model. Random weights never end an answer, so every answer stops at max_tokens
    (finish reason `length`: truncated, not compared); `stop` strings end them, for tests that need compared
    pairs."""
    text = f"""
[paths.{name}]
engine = "torch"
model = "{model_dir}"
dtype = "float32"
batch_size = {batch_size}
max_tokens = {max_tokens}
prefix_caching = {str(prefix_caching).lower()}
"""
    if prefill is not None:
        text += f"prompt = {{ prefill = {json.dumps(prefill)} }}\n"
    if stop is not None:
        text += f"stop = {json.dumps(list(stop))}\n"
    if speculative:
        text += ('speculative = { method = "ngram", num_speculative_tokens = 3, prompt_lookup_min = 1, '
                 'prompt_lookup_max = 3 }\n')
    return text


def openai_path_toml(name: str, base_url: str, model: str, *, max_tokens: int = 12, batch_size: int = 4,
                     **options) -> str:
    """An `engine = "openai"` path; options are TOML values written with json.dumps (strings, numbers, bools)
    or inline tables given as ready TOML text via a str starting with '{'."""
    lines = [f"[paths.{name}]", 'engine = "openai"', f'base_url = "{base_url}"', f'model = "{model}"',
             f"max_tokens = {max_tokens}", f"batch_size = {batch_size}"]
    for key, value in options.items():
        if isinstance(value, str) and value.startswith("{"):
            lines.append(f"{key} = {value}")
        else:
            lines.append(f"{key} = {json.dumps(value)}")
    return "\n" + "\n".join(lines) + "\n"


def get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def post(url: str, body: bytes | dict, timeout: float = 60.0) -> tuple[int, bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class ServeProcess:
    """`python -m toolaudit serve --port 0` as a subprocess; `wait()` returns its base URL (.../v1) once /health
    answers 200. Start several, then wait for each: they load their models in parallel."""

    def __init__(self, paths_file: Path, path: str, log: Path, extra: tuple[str, ...] = (), threads: int = 1):
        self.log = log
        # one torch thread: on a busy 2-core machine a second OpenMP thread makes the tiny model ~50x slower
        env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS=str(threads))
        with log.open("wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "toolaudit", "serve", "--paths", str(paths_file),
                                          "--path", path, "--port", "0", *extra],
                                         env=env, stdout=subprocess.DEVNULL, stderr=err)
        self.base_url: str | None = None

    @property
    def root(self) -> str:
        return self.base_url.removesuffix("/v1")

    def wait(self, timeout: float = 120.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited with {self.proc.returncode}: {self.log.read_text()}")
            if self.base_url is None:
                for line in self.log.read_text().splitlines():
                    if "listening on " in line:
                        self.base_url = line.split("listening on ", 1)[1].split()[0]
            if self.base_url is not None and get(self.root + "/health", timeout=2)[0] == 200:
                return self.base_url
            time.sleep(0.1)
        raise RuntimeError(f"serve did not become healthy in {timeout}s: {self.log.read_text()}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


class CollectProcess:
    """`python -m toolaudit collect --port 0 --dir FOLDER` as a subprocess; `url` (http://127.0.0.1:PORT) once it
    has announced its address (about a second: it loads no model). Its stderr is copied line by line to `log` by
    a thread, which hands over the address as soon as it is printed: nothing polls."""

    def __init__(self, folder: Path, log: Path, *extra: str):
        import queue
        import threading

        self.folder, self.log = folder, log
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.proc = subprocess.Popen([sys.executable, "-m", "toolaudit", "collect", "--port", "0", "--dir",
                                      str(folder), *extra], env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        self._address: queue.Queue[str | None] = queue.Queue()
        self._copier = threading.Thread(target=self._copy_stderr, daemon=True, name="collect-stderr")
        self._copier.start()
        self.url = self._wait()

    def _copy_stderr(self) -> None:
        with self.log.open("wb") as out:
            for raw in self.proc.stderr:
                out.write(raw)
                out.flush()  # written before the address is handed over: the log holds what came first
                text = raw.decode("utf-8", "replace")
                if "listening on " in text:
                    self._address.put(text.split("listening on ", 1)[1].split()[0])
        self._address.put(None)  # end of stderr: the process exited

    def _wait(self, timeout: float = 30.0) -> str:
        import queue

        try:
            url = self._address.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"collect did not listen in {timeout}s: {self.log.read_text()}") from None
        if url is None:
            raise RuntimeError(f"collect exited with {self.proc.wait()}: {self.log.read_text()}")
        return url

    def stop(self) -> int:
        """SIGTERM, as a service manager stops it; the exit code (a kill after 15 s). The log is complete after."""
        code = ServeProcess.stop(self)
        self._copier.join(timeout=10)
        return code

    def kill9(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self._copier.join(timeout=10)


class AppThread:
    """An aiohttp application on a free loopback port (or `port`), served by an event loop on a daemon thread, so a
    synchronous test (and the synchronous engines) can talk to it. `on_start` coroutines run on that loop."""

    def __init__(self, app, on_start: tuple = (), port: int = 0):
        import asyncio
        import threading

        from aiohttp import web

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="test-app")
        self.thread.start()

        async def start():
            runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            self.tasks = [asyncio.get_running_loop().create_task(c) for c in on_start]
            return runner

        self.runner = asyncio.run_coroutine_threadsafe(start(), self.loop).result(timeout=30)
        self.port = self.runner.addresses[0][1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    def call(self, coro, timeout: float = 30):
        import asyncio

        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=timeout)

    def close(self) -> None:
        async def stop():
            for task in self.tasks:
                task.cancel()
            await self.runner.cleanup()

        self.call(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


def short_demo_requests(n: int) -> list:
    """The `n` demo calls whose prompts (messages and tools, as JSON) are shortest, as engine requests, in trace
    order. Real calls with real tools; short because prefill is most of a real-model test's time on a CPU (~4 ms
    a prompt token on one AVX2 core, float32), and the demo's prompts run from 600 to 2,700 characters."""
    from toolaudit.engines.base import EngineRequest

    rows = [json.loads(line) for line in DEMO.read_text().splitlines() if line.strip()]
    size = [len(json.dumps(r["request"]["messages"])) + len(json.dumps(r["request"].get("tools", []))) for r in rows]
    chosen = sorted(sorted(range(len(rows)), key=lambda i: (size[i], i))[:n])
    return [EngineRequest(key=f"demo-{i}", messages=rows[i]["request"]["messages"],
                          tools=rows[i]["request"].get("tools", [])) for i in chosen]


def smollm2_dir() -> Path:
    """The converted SmolLM2-135M directory (built on first use), or skip the test when it cannot be built."""
    import pytest

    from toolaudit import ConfigError
    from toolaudit.engines.models import converted_dir, resolve

    try:
        return converted_dir(resolve("smollm2-135m"))
    except ConfigError as exc:
        pytest.skip(str(exc))


def vllm_child_env() -> dict[str, str]:
    """The environment of a vLLM server or `run_batch` started by a test: 1 GB of KV cache, the xdist worker's
    core (tests/conftest.py), and the worker kept in the engine core. VLLM_ENABLE_V1_MULTIPROCESSING=0 is what
    keeps `--distributed-executor-backend uni`: vLLM's CPU platform turns `uni` into `mp` without it, a worker
    process of its own (~11 s more of imports on one core). The engine core is still a process of its own (the
    server's and run_batch's async client always starts one)."""
    bind = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "0")
    return dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND=bind, PYTHONUNBUFFERED="1",
                VLLM_ENABLE_V1_MULTIPROCESSING="0")


def child_processes() -> set[str]:
    """This process's child processes, except multiprocessing's resource tracker (started once, kept for good)."""
    import psutil

    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if "resource_tracker" not in cmd:
            out.add(f"{p.pid} {p.name()} {cmd[:80]}")
    return out
