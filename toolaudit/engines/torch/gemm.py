"""CPU linears through oneDNN's prepacked kernels: float32 (float32 paths and emulated numerics) and native bf16.

Why: float32 and emulated numerics (`numerics.py`) spend most of their time in float32 `nn.Linear`s, and
torch's default CPU path (MKL sgemm on the weight as stored) is slow for the shapes decoding has: 16-96 rows
against SmolLM2's 576 x 49152 LM head took 18 / 46 ms on two AVX2 threads, the same product on oneDNN with the
weight reordered once into its blocked layout 6 / 25 ms, and a layer's 16-row projections 1.2-2.6x less
(`benchmarks/bench_gemm.py`). Native bf16 linears already run oneDNN, but reorder the weight on every call:
prepacked they are 1.04-1.9x faster and gave the same bits on every shape measured. The weights are reordered
once at load. float32 accumulation stays; a float32 result's summation order differs from MKL's (|difference|
~1e-6 on unit-scale outputs, far below the logit margins that decide tokens), so a path names its kernel in its
fingerprint (`gemm`). float64 has no oneDNN linear and keeps torch's default: the exactness tests run on it.
"""

from __future__ import annotations

import functools
import types

import torch

from .numerics import has_native

PREPACKED = "onednn-prepacked"  # the fingerprint's name for linears on prepacked oneDNN weights
DEFAULT = "aten"  # torch's own dispatch (MKL sgemm for float32 on x86, oneDNN with a per-call reorder for bf16)
BATCH_HINT = 64  # rows the weight layout is tuned for; 16-512 measured alike, and any row count works


@functools.lru_cache(maxsize=1)
def prepacking_available() -> bool:
    """Whether this torch build has oneDNN's prepacked float32 linear (x86/aarch64 CPU builds do)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        out = linear(torch.ones(2, 4), pack(torch.ones(8, 4)))
    except (AttributeError, RuntimeError):
        return False
    return bool(torch.equal(out, torch.full((2, 8), 4.0)))


def kernel(numerics: str, device: str, dtype: str) -> str:
    """The linear kernel a path runs: prepacked oneDNN on a CPU build that has it, for float32 weights (float32
    paths, emulated numerics) and for native bf16 where the CPU multiplies bf16 natively (oneDNN refuses bf16
    weights on CPUs without AVX512-BF16/AMX-class support, and native bf16 there is forced and slow anyway);
    else torch's default."""
    if device != "cpu" or not prepacking_available():
        return DEFAULT
    if numerics == "emulated" or dtype == "float32":
        return PREPACKED
    if numerics == "native" and dtype == "bfloat16" and has_native(dtype, device):
        return PREPACKED
    return DEFAULT


def pack(weight: torch.Tensor) -> torch.Tensor:
    """`weight` ([out, in], float32 or bf16) reordered once into oneDNN's blocked layout, for `linear`."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, BATCH_HINT)


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` on a weight from `pack`."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")


def prepack_linears(model: torch.nn.Module) -> int:
    """Route every float32 or bf16 `nn.Linear` of `model` through a prepacked copy of its weight; how many.

    The module keeps its parameters (tied weights, state_dict and hooks are unchanged); forward hooks, such as
    emulation's output rounding, still run around the new forward. Costs one extra copy of the weights.
    """
    count = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module.weight.dtype in (torch.float32, torch.bfloat16):
            packed = pack(module.weight.detach())
            module.forward = types.MethodType(functools.partial(_prepacked_forward, packed=packed), module)
            count += 1
    return count


def _prepacked_forward(self: torch.nn.Linear, x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    return linear(x, packed, self.bias)
