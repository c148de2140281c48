"""The vLLM engine's own `[paths.NAME]` keys, validated without importing vLLM (paths.toml is read first).

Keys mirror vLLM's engine arguments:

- `max_num_seqs`: requests decoded together (vLLM's scheduler slots); default: the path's `batch_size`.
- `max_model_len`: context length vLLM reserves per sequence; default: the model's own.
- `tensor_parallel_size`: GPUs one model is split over (1 on CPU).
- `gpu_memory_utilization`: share of GPU memory vLLM may take (0 < x <= 1); CUDA only, ignored on CPU, where
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

from typing import Any, Callable

from toolaudit import ConfigError

from ..base import Capabilities
from ..logs import LogNote
from ..registry import EngineSpec

PROMPT_FORMATS = ("toolaudit", "chat_template")
DTYPES = ("float32", "bfloat16", "float16")  # vLLM has no float64 kernels
# Speculative methods vLLM 0.32 accepts (`vllm.config.speculative.SpeculativeMethod`, the common ones); those in
# NEEDS_MODEL take a draft/head checkpoint in `speculative.model`.
SPEC_METHODS = ("ngram", "draft_model", "eagle", "eagle3", "mtp", "medusa", "mlp_speculator", "suffix")
SPEC_NEEDS_MODEL = ("draft_model", "eagle", "eagle3", "medusa", "mlp_speculator")

KEYS: frozenset[str] = frozenset({
    "max_num_seqs", "max_model_len", "tensor_parallel_size", "gpu_memory_utilization", "enforce_eager",
    "batch_invariant", "engine_args", "prompt_format", "in_process",
})

# engine_args may not override what the common keys or the keys above decide.
RESERVED_ENGINE_ARGS = frozenset({
    "model", "tokenizer", "dtype", "seed", "speculative_config", "enable_prefix_caching", "max_num_seqs",
    "max_model_len", "tensor_parallel_size", "gpu_memory_utilization", "enforce_eager", "disable_log_stats",
    "per_request_spec_decode_metrics", "distributed_executor_backend",
})

DEFAULTS: dict[str, Any] = {
    "max_num_seqs": None,  # None: the path's batch_size
    "max_model_len": None,  # None: the model's
    "tensor_parallel_size": 1,
    "gpu_memory_utilization": 0.9,
    "enforce_eager": True,
    "batch_invariant": False,
    "engine_args": {},
    "prompt_format": "toolaudit",
    "in_process": False,
}


def parse_options(table: dict[str, Any], fail: Callable[[str, str], ConfigError]) -> dict[str, Any]:
    """Validated vLLM options (every key of `DEFAULTS`, defaults filled in) from a `[paths.NAME]` table.

    Also checks the common keys whose allowed values differ for vLLM (dtype, device, speculative.method), so a
    path vLLM cannot run fails when paths.toml is read, not after a model load.
    """
    opts = dict(DEFAULTS)
    for key in ("max_num_seqs", "max_model_len", "tensor_parallel_size"):
        if key in table:
            value = table[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise fail(key, f"must be a positive integer (got {value!r})")
            opts[key] = value
    if "gpu_memory_utilization" in table:
        value = table["gpu_memory_utilization"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise fail("gpu_memory_utilization", f"must be a number in (0, 1] (got {value!r})")
        opts["gpu_memory_utilization"] = float(value)
    for key in ("enforce_eager", "batch_invariant", "in_process"):
        if key in table:
            if not isinstance(table[key], bool):
                raise fail(key, f"must be true or false (got {table[key]!r})")
            opts[key] = table[key]
    if "engine_args" in table:
        args = table["engine_args"]
        if not isinstance(args, dict):
            raise fail("engine_args", "must be a table of vllm.LLM keyword arguments")
        clash = sorted(set(args) & RESERVED_ENGINE_ARGS)
        if clash:
            raise fail(f"engine_args.{clash[0]}", "is set by the path itself; use the path key instead")
        opts["engine_args"] = dict(args)
    if "prompt_format" in table:
        value = table["prompt_format"]
        if value not in PROMPT_FORMATS:
            raise fail("prompt_format", f"must be one of {', '.join(PROMPT_FORMATS)} (got {value!r})")
        opts["prompt_format"] = value

    device = table.get("device", "cpu")
    if table.get("dtype") == "float64":
        raise fail("dtype", f"float64 is not supported by vLLM (use one of {', '.join(DTYPES)})")
    if opts["batch_invariant"] and device == "cpu":
        raise fail("batch_invariant", "is not supported by vLLM on CPU (its batch-invariant kernels are Triton, "
                                      "for CUDA/ROCm/XPU; with VLLM_BATCH_INVARIANT=1 the CPU worker fails)")
    if device == "cpu" and opts["tensor_parallel_size"] != 1:
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
    return opts


def options_of(path_options: dict[str, Any]) -> dict[str, Any]:
    """The options of a `PathConfig` built in code (possibly empty or partial), defaults filled in."""
    return {**DEFAULTS, **{k: v for k, v in path_options.items() if k in DEFAULTS}}


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
ENGINE = EngineSpec(name="vllm", factory="toolaudit.engines.vllm.engine:VLLMEngine", keys=KEYS,
                    parse_options=parse_options, capabilities=CAPABILITIES, notes=NOTES)
