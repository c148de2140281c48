"""bf16 / fp16 numerics on CPUs without native low-precision matmul: "bf16 on fp32 kernels".

Why: torch's bf16 and fp16 matmuls are only fast where the CPU multiplies them natively (AVX512-BF16 or AMX
for bf16, AVX512-FP16 or AMX-FP16 for fp16). Elsewhere (AVX2-only x86) they run ~100x slower than float32, and
a bf16 replay never finishes. `dtype = "bfloat16"` means bf16 *numerics*, so on such CPUs the engine emulates
them: weights rounded to bf16 and kept in float32, float32 accumulation, and every tensor a bf16 kernel writes
rounded to bf16 (round to nearest even, like a real cast) - what a cuBLAS bf16 GEMM does (fp32 accumulate,
bf16 output), at float32 speed. Elementwise ops (norm, SiLU, RoPE, products, residual adds) are then
bit-identical to native bf16, matmuls differ only in summation order (outputs ~99.9% bit-identical), prefill
attention in its exp (~97%). `resolve` picks the numerics a path runs.

Where `emulate` rounds, for Llama-style layers (the order of a layer's forward pass):
  weights               loaded in the low dtype as a native path would, then upcast (exact)
  rotary cos/sin        output of `rotary_emb` (native casts them to the activations' dtype)
  norms                 RMSNorm's normalized activations and its weighted output (native rounds both)
  every nn.Linear       its output: q/k/v/o, gate/up/down projections and the LM head (the logits)
  RoPE                  q*cos, rotate_half(q)*sin and their sum, for q and k, as eager native bf16 does
                        (`_rounded_rope`, used when cos carries the dtype: emulating models only)
  q, k after RoPE       again in `attention.grouped_attention` and as `attention.SplitLayer` caches keys, for
                        models whose RoPE ran elsewhere (`_rounded_rope`'s outputs say they are rounded: skipped)
  attention             decode steps and verification passes (the matmul path): scores, probabilities and
                        output, as the native path writes them, except that a split cache's two partial value
                        products are added in float32 before the output's rounding (as flash-decoding kernels
                        combine partials; native rounds each product); prefill: flash-style, exp(score -
                        running max) rounded before it multiplies the values, then the output
                        (`attention._flash_rounded`)
  residual sums         after attention: in place, as `post_attention_layernorm` receives it (the same
                        tensor is the layer's next residual); after the MLP: the decoder layer's output
  MLP                   SiLU output, and the SiLU x up product as `down_proj` receives it
Embeddings need no rounding: a lookup of rounded weights.
"""

from __future__ import annotations

import functools
import sys
import types

import torch

from toolaudit import ConfigError

from .config import NUMERICS

ROUNDED = "toolaudit_rounded"  # attribute of a tensor whose values are already rounded to that dtype (RoPE's output)
SIGNED_SIN = "toolaudit_signed_sin"  # attribute of a forward pass's sin: sin with its first half negated (RoPE)
ROUND_TO = "toolaudit_round_to"  # attribute of an emulated model and of its attention modules: the dtype
LOW_PRECISION = {"bfloat16": torch.bfloat16, "float16": torch.float16}
# /proc/cpuinfo flags of CPUs whose matmuls run the dtype natively (oneDNN's avx512_core_bf16/amx/_fp16 kernels)
NATIVE_FLAGS = {"bfloat16": ("avx512_bf16", "amx_bf16"), "float16": ("avx512_fp16", "amx_fp16")}
EMULATED_MODEL_TYPES = ("llama",)  # layer structure checked against transformers' LlamaDecoderLayer


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (x86 `flags` line of /proc/cpuinfo); empty where unreadable."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_capability() -> str:
    """torch's vector ISA for CPU kernels plus the native low-precision matmul flags, e.g. "AVX512+avx512_bf16"
    or "AVX2": what decides whether a CPU runs bf16/fp16 natively, so it is part of a path's fingerprint."""
    flags = [f for dtype, names in NATIVE_FLAGS.items() if onednn_supports(dtype)
             for f in names if f in cpu_flags()]
    return "+".join([torch.backends.cpu.get_cpu_capability(), *flags])


def has_native(dtype: str, device: str) -> bool:
    """Whether `device` multiplies `dtype` natively: CUDA always; a CPU when it has one of `NATIVE_FLAGS`."""
    if device.startswith("cuda"):
        return True
    return onednn_supports(dtype) and any(flag in cpu_flags() for flag in NATIVE_FLAGS.get(dtype, ()))


# oneDNN's own answer to "may I run this dtype's kernels here": it reads the CPU and `ONEDNN_MAX_CPU_ISA`, so a
# process limited to AVX2 (`ONEDNN_MAX_CPU_ISA=AVX2`, how the suite runs as an AVX2-only machine would) has no
# bf16 matmul even on a CPU whose flags list avx512_bf16, and its weights cannot be prepacked in bf16.
_ONEDNN_CHECKS = {"bfloat16": "_is_mkldnn_bf16_supported", "float16": "_is_mkldnn_fp16_supported"}


@functools.lru_cache(maxsize=None)
def onednn_supports(dtype: str) -> bool:
    """Whether this process's oneDNN runs `dtype` matmuls (False where the build has no such check)."""
    check = getattr(torch.ops.mkldnn, _ONEDNN_CHECKS.get(dtype, ""), None)
    try:
        return bool(check()) if check is not None else False
    except RuntimeError:
        return False


def resolve(dtype: str, device: str, requested: str = "auto") -> str:
    """The numerics a path runs: "native" or "emulated". float32/float64 always run natively; "auto" emulates
    a low-precision dtype where the device has no native kernels for it (see `has_native`)."""
    if requested not in NUMERICS:
        raise ConfigError(f"numerics must be one of {', '.join(NUMERICS)} (got {requested!r})")
    if dtype not in LOW_PRECISION:
        if requested == "emulated":
            raise ConfigError(f"numerics 'emulated' applies to bfloat16 and float16 only (dtype is {dtype})")
        return "native"
    if requested == "auto":
        return "native" if has_native(dtype, device) else "emulated"
    return requested


def round_to(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`t` rounded to `dtype` (nearest even) and back to its own dtype: what a kernel writing `dtype` stores."""
    return t.to(dtype).to(t.dtype)


def emulated_dtype(model: torch.nn.Module) -> torch.dtype | None:
    """The dtype a model emulates, or None for a model running natively."""
    return getattr(model, ROUND_TO, None)


def emulate(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Make a model loaded natively in `dtype` run that dtype's numerics on float32 kernels (in place).

    The model must run the engine's attention (`attention.use_grouped_attention`): that kernel and the cache
    layers it reads round the attention tensors. Not reversible: load a fresh model for native numerics.
    """
    kind = getattr(model.config, "model_type", None)
    if kind not in EMULATED_MODEL_TYPES:
        raise ConfigError(f"numerics 'emulated' supports {', '.join(EMULATED_MODEL_TYPES)} models (got {kind!r})")
    if getattr(model.config, "_attn_implementation", None) not in ("toolaudit", "toolaudit-invariant"):
        raise ValueError("emulate() needs the engine's attention: call attention.use_grouped_attention first")
    if emulated_dtype(model) is not None:
        raise ValueError("model is already emulating low-precision numerics")
    if any(p.dtype != dtype for p in model.parameters()):
        raise ValueError(f"emulate() takes a model loaded in {dtype}: its weights are what a native path multiplies")
    model.to(torch.float32)  # bf16/fp16 -> fp32 is exact: the weights stay the native ones, bit for bit
    rounded = functools.partial(round_to, dtype=dtype)

    def rotary_hook(module, args, output):
        cos, sin = (rounded(t) for t in output)
        setattr(cos, ROUND_TO, dtype)  # tells `_rounded_rope` to round like native bf16 (see `_patch_rope`)
        return cos, sin

    def output_hook(module, args, output):
        return rounded(output) if isinstance(output, torch.Tensor) else tuple(
            rounded(o) if isinstance(o, torch.Tensor) else o for o in output)

    def input_hook(module, args):
        return (rounded(args[0]), *args[1:])

    def residual_in_place(module, args):
        args[0].copy_(args[0].to(dtype))  # the residual sum; the layer keeps this same tensor as its residual

    base = model.base_model
    base.rotary_emb.register_forward_hook(rotary_hook)
    _patch_rope(sys.modules[type(base.layers[0].self_attn).__module__])
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_hook(output_hook)
        elif hasattr(module, "variance_epsilon") and type(module).__name__.endswith("RMSNorm"):
            module.forward = types.MethodType(functools.partial(_rms_norm, dtype=dtype), module)
    for layer in base.layers:
        layer.post_attention_layernorm.register_forward_pre_hook(residual_in_place)
        layer.register_forward_hook(output_hook)  # the sum after the MLP
        layer.mlp.act_fn.register_forward_hook(output_hook)
        layer.mlp.down_proj.register_forward_pre_hook(input_hook)  # act(gate) * up
        setattr(layer.self_attn, ROUND_TO, dtype)
    setattr(model, ROUND_TO, dtype)
    return model


def _patch_rope(modeling) -> None:
    """Route a modeling module's `apply_rotary_pos_emb` through `_rounded_rope` when cos carries a dtype.

    RoPE is a free function the attention's forward looks up in its module, with no hook point; the wrapper
    changes nothing for other models (their cos has no `ROUND_TO`). Installed once per module.
    """
    original = modeling.apply_rotary_pos_emb
    if getattr(original, ROUND_TO, False):
        return

    @functools.wraps(original)
    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        dtype = getattr(cos, ROUND_TO, None)
        if dtype is None:
            return original(q, k, cos, sin, *args, **kwargs)
        return _rounded_rope(q, k, cos, sin, dtype, *args, **kwargs)

    setattr(apply_rotary_pos_emb, ROUND_TO, True)
    modeling.apply_rotary_pos_emb = apply_rotary_pos_emb


def _rounded_rope(q, k, cos, sin, dtype, unsqueeze_dim: int = 1):
    """transformers' apply_rotary_pos_emb with the three roundings of eager bf16: each product and the sum.

    The same bits in fewer operations (a decode step runs these 30 times, each op costing more in dispatch than in
    arithmetic): q and k go through together, and rotate_half(x) * sin is x rolled by half its width times sin with
    its first half negated (negation is exact, so each product is the same). The results carry `ROUNDED` so the
    attention and the cache skip rounding them again.
    """
    signed = getattr(sin, SIGNED_SIN, None)  # the same sin serves every layer of a forward pass: made once
    if signed is None:
        half = sin.shape[-1] // 2
        signed = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        setattr(sin, SIGNED_SIN, signed)
    x = torch.cat((q, k), dim=unsqueeze_dim)  # the heads' axis: the one cos and sin are broadcast over
    products = (round_to(x * cos.unsqueeze(unsqueeze_dim), dtype)
                + round_to(x.roll(x.shape[-1] // 2, -1) * signed.unsqueeze(unsqueeze_dim), dtype))
    out = round_to(products, dtype)
    q_out, k_out = out.split([q.shape[unsqueeze_dim], k.shape[unsqueeze_dim]], dim=unsqueeze_dim)
    setattr(q_out, ROUNDED, dtype)
    setattr(k_out, ROUNDED, dtype)
    return q_out, k_out


def rounded(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`round_to(t, dtype)`, skipped for a tensor that says it holds `dtype` values already (`ROUNDED`)."""
    return t if getattr(t, ROUNDED, None) is dtype else round_to(t, dtype)


def _rms_norm(self, hidden_states: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """transformers' LlamaRMSNorm.forward in float32 with its two low-precision casts: the normalized
    activations (`.to(input_dtype)`) and the product with the weight (a bf16 x bf16 multiply)."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    normed = round_to(hidden_states * torch.rsqrt(variance + self.variance_epsilon), dtype)
    return round_to(self.weight * normed, dtype)
