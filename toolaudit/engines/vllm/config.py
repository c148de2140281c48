"""The vLLM engine's own `[paths.NAME]` keys, validated without importing vLLM (paths.toml is read first).

Keys mirror vLLM's engine arguments:

- `max_num_seqs`: requests decoded together (vLLM's scheduler slots); default: the path's `batch_size`.
- `max_model_len`: context length vLLM reserves per sequence; default: the model's own.
- `tensor_parallel_size`: GPUs one model is split over (1 on CPU).
- `gpu_memory_utilization`: share of GPU memory vLLM may take (0 < x <= 1; default vLLM's 0.9, or what is free
  if less is: torch paths of the same replay may hold some); CUDA only, ignored on CPU, where
  the KV cache size comes from `$VLLM_CPU_KVCACHE_SPACE` (GiB; the engine sets 1 when unset).
- `enforce_eager`: no CUDA graphs / torch.compile (default true: the first call stays fast and the numerics
  are the plain kernels').
- `batch_invariant`: run with `VLLM_BATCH_INVARIANT=1` (results independent of batch composition). vLLM 0.32
  implements it with Triton kernels for CUDA/ROCm/XPU only: on CPU its worker crashes on the first step, so
  a CPU path asking for it is refused here.
- `in_process`: run vLLM's engine core and its worker in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`,
  `distributed_executor_backend = "uni"`) instead of two processes of their own (default false, as a server runs).
  Same kernels and numerics, no process start-up: a load took 11 s instead of 28 s on 2 AVX2 cores, most of the
  difference the two processes importing vLLM and torch again. For CI and short CPU replays; not numerics, so
  not in the fingerprint.
- `engine_args`: a table passed to `vllm.LLM(...)` as is (e.g. `{kv_cache_dtype = "fp8"}`), after the keys
  above; it may not repeat what the path already says (model, dtype, seed, speculative_config, ...).
- `prompt_format`: `"toolaudit"` (default) renders requests exactly as the embedded engine does (same
  tokenizer, same template, few-shot examples and prefill) and hands vLLM the token ids, so both engines see
  identical prompts; `"chat_template"` lets vLLM render (`LLM.chat` path: the model's chat template with
  `tools=`), which is what a vLLM server would do. (Named `prompt_format` because `prompt` is the common
  table `{few_shot, prefill}`.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..base import Capabilities
from ..logs import LogNote
from ..options import Fail, key
from ..registry import EngineSpec

PROMPT_FORMATS = ("toolaudit", "chat_template")
DTYPES = ("float32", "bfloat16", "float16")  # vLLM has no float64 kernels
# Speculative methods vLLM 0.32 accepts (`vllm.config.speculative.SpeculativeMethod`, the common ones); those in
# NEEDS_MODEL take a draft/head checkpoint in `speculative.model`.
SPEC_METHODS = ("ngram", "draft_model", "eagle", "eagle3", "mtp", "medusa", "mlp_speculator", "suffix")
SPEC_NEEDS_MODEL = ("draft_model", "eagle", "eagle3", "medusa", "mlp_speculator")

# engine_args may not override what the common keys or the keys above decide.
RESERVED_ENGINE_ARGS = frozenset({
    "model", "tokenizer", "dtype", "seed", "speculative_config", "enable_prefix_caching", "max_num_seqs",
    "max_model_len", "tensor_parallel_size", "gpu_memory_utilization", "enforce_eager", "disable_log_stats",
    "per_request_spec_decode_metrics", "distributed_executor_backend",
})

@dataclass(frozen=True)
class VLLMOptions:
    """The vLLM engine's own keys (every one stored with its default: `PathConfig.options` holds them all)."""

    max_num_seqs: int | None = key(None, low=1, doc="scheduler slots (None: the path's batch_size)")
    max_model_len: int | None = key(None, low=1, doc="context length per sequence (None: the model's)")
    tensor_parallel_size: int = key(1, low=1, doc="GPUs one model is split over")
    # None: vLLM's 0.9, or what is free on the GPU if less is (`VLLMEngine._memory_share`)
    gpu_memory_utilization: float | None = key(None, low=0, low_open=True, high=1, doc="share of GPU memory")
    enforce_eager: bool = key(True, doc="no CUDA graphs / torch.compile")
    batch_invariant: bool = key(False, doc="VLLM_BATCH_INVARIANT=1")
    engine_args: dict = key({}, what="a table of vllm.LLM keyword arguments", doc="passed to vllm.LLM")
    prompt_format: str = key("toolaudit", allowed=PROMPT_FORMATS, doc="who renders the prompt")
    in_process: bool = key(False, doc="engine core and worker in this process")


def check(opts: VLLMOptions, table: dict[str, Any], fail: Fail) -> None:
    """engine_args against what the path decides, and the common keys whose allowed values differ for vLLM
    (dtype, device, speculative.method), so a path vLLM cannot run fails when paths.toml is read, not after a
    model load."""
    clash = sorted(set(opts.engine_args) & RESERVED_ENGINE_ARGS)
    if clash:
        raise fail(f"engine_args.{clash[0]}", "is set by the path itself; use the path key instead")
    device = table.get("device", "cpu")
    if table.get("dtype") == "float64":
        raise fail("dtype", f"float64 is not supported by vLLM (use one of {', '.join(DTYPES)})")
    if opts.batch_invariant and device == "cpu":
        raise fail("batch_invariant", "is not supported by vLLM on CPU (its batch-invariant kernels are Triton, "
                                      "for CUDA/ROCm/XPU; with VLLM_BATCH_INVARIANT=1 the CPU worker fails)")
    if device == "cpu" and opts.tensor_parallel_size != 1:
        raise fail("tensor_parallel_size", "must be 1 on CPU")
    if isinstance(device, str) and device.startswith("cuda:") and device != "cuda:0":
        raise fail("device", "must be cpu, cuda or cuda:0 for vLLM (pick the GPU with CUDA_VISIBLE_DEVICES)")
    spec = table.get("speculative")
    if isinstance(spec, dict) and "method" in spec:
        method = spec["method"]
        if method not in SPEC_METHODS:
            raise fail("speculative.method", f"must be one of {', '.join(SPEC_METHODS)} for vLLM (got {method!r})")
        if method in SPEC_NEEDS_MODEL and not spec.get("model"):
            raise fail("speculative.model", f"is required for method {method}")


# vLLM's CPU workers spin while waiting and two instances starve each other (or split GPU memory): replays run
# one vLLM path over the whole selection, release it, then the next.
CAPABILITIES = Capabilities(sees_logits=True, decodes_tokens=True, holds_together=False, in_process=True)
# What in vLLM's own log changes how a user should read the run: its CPU speed is not a tuned deployment's.
NOTES = (
    LogNote(r"(libtcmalloc|libiomp) is not found in LD_PRELOAD",
            "vLLM ran without tcmalloc / Intel OpenMP preloaded (LD_PRELOAD), which it says costs speed on CPU: "
            "its tokens/s are below a tuned deployment's"),
    LogNote(r"force killing (remaining process|sub process)",
            "vLLM's engine processes did not exit within its shutdown grace period and were killed"),
)
ENGINE = EngineSpec(name="vllm", factory="toolaudit.engines.vllm.engine:VLLMEngine", options=VLLMOptions,
                    check=check, capabilities=CAPABILITIES, notes=NOTES)
KEYS = ENGINE.keys
