"""A compiled attention kernel for emulated bf16 decode steps and verification passes (C, AVX2 + FMA, ctypes).

Why: on a CPU without native bf16 matmuls the demo's paths emulate bf16 (`numerics`), and a decode step's
attention ran as torch ops: batched matmuls over the float32 KV cache (padding columns included) with 3 query
rows per key/value head, the softmax, the mask and five rounding copies, ~1.6 ms of a 16-row step's ~6 ms per
layer. This kernel reads each row's valid columns once with mask, softmax and roundings fused: a 16-row decode
step ~18% faster, a 6-position verification pass ~16% (docs/benchmarks.md).

Two numerics, as serving engines run a decode kernel for one-token steps and a prefill kernel for multi-token
blocks (FlashInfer's two; vLLM's verification passes go the prefill way too):
- one-token decode steps: eager attention's roundings (scores, probabilities, output), as torch's path;
- verification passes (up to `attention.SHORT_QUERY` positions): flash attention's, those of the emulated
  prefill (`attention._flash_rounded`: float32 scores, exp(score - running max) rounded before the value
  product, key blocks of `attention.KV_BLOCK` columns, one division at the end).
So speculation's verification reduces in another order than the steps it stands in for, the effect toolaudit
measures. Either way the float32 sums run in another order than torch's (~99.9% of outputs bit-identical), and a
row's output depends on nothing but the row: not its batch neighbours, the padding, the thread count or where
the cache splits. A path's decode steps are therefore batch-invariant here, and its noise floor (the same path at
another batch size) comes out at zero where the linears are batch-invariant too (oneDNN's are on these CPUs).
A path's fingerprint names the kernel (`attention_kernel`).

It is built on first use with the system's C compiler (`$CC`, else `cc`; about a second) into the user's cache
(`~/.cache/toolaudit/kernels`, keyed by the source and the flags) and linked against the OpenMP runtime torch
already loaded, so its threads are torch's (`torch.set_num_threads` holds). Where there is no compiler, the CPU
lacks AVX2/FMA, or `TOOLAUDIT_ATTENTION_KERNEL=torch`, torch's ops run and the fingerprint names no kernel.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("kernels") / "attention.c"
FLAGS = ("-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC")
NAME = "c-avx2-2"  # fingerprint name: change it with any change to the kernel's numerics
ENV = "TOOLAUDIT_ATTENTION_KERNEL"  # "torch": never use the kernel
KERNEL = "toolaudit_attention_kernel"  # attribute of an attention module that runs the kernel


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "toolaudit" / "kernels"


@functools.lru_cache(maxsize=1)
def _library() -> ctypes.CDLL | None:
    """The kernel's shared library, built if needed; None where it cannot be (the reason in `unavailable()`)."""
    return _build()[0]


@functools.lru_cache(maxsize=1)
def _build() -> tuple[ctypes.CDLL | None, str]:
    from .numerics import cpu_flags

    if os.environ.get(ENV, "auto") == "torch":
        return None, f"{ENV}=torch"
    if not {"avx2", "fma"} <= cpu_flags():
        return None, "the CPU has no AVX2/FMA"
    compiler = shutil.which(os.environ["CC"]) if os.environ.get("CC") else shutil.which("cc") or shutil.which("gcc")
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source + " ".join(FLAGS).encode()).hexdigest()[:16]
    target = cache_dir() / f"attention-{digest}.so"
    if not target.exists():
        if compiler is None:
            return None, "no C compiler (set CC)"
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            target = Path(tempfile.gettempdir()) / "toolaudit-kernels" / target.name
            target.parent.mkdir(parents=True, exist_ok=True)
        # Built beside the target and renamed: concurrent processes (test workers) never load a half-written file.
        fd, partial = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
        try:
            done = subprocess.run([compiler, *FLAGS, "-o", partial, str(SOURCE)], capture_output=True, text=True,
                                  timeout=120)
            if done.returncode != 0:
                return None, f"the compiler failed: {done.stderr.strip()[-300:]}"
            os.replace(partial, target)
        except (OSError, subprocess.SubprocessError) as exc:
            return None, f"the compiler failed: {exc}"
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
    try:
        lib = ctypes.CDLL(str(target))
    except OSError as exc:
        return None, f"cannot load {target}: {exc}"
    pointer, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.ta_attention.restype = i32
    lib.ta_attention.argtypes = [pointer, i64, i64, i32, i32, i32, *([pointer, pointer, i64, i64, i64] * 2),
                                 pointer, i64, ctypes.c_float, i32, pointer]
    return lib, ""


def available() -> bool:
    """Whether the kernel runs in this process (built and loaded; not turned off)."""
    return _library() is not None


def unavailable() -> str:
    """Why the kernel does not run here ("" when it does)."""
    return _build()[1]


def kernel_name(numerics: str, dtype: str, device: str, invariant: bool) -> str | None:
    """The kernel a path's attention runs where it is not torch's ops (its fingerprint names it), else None:
    emulated bf16 on a CPU, outside the batch-invariant layout (which has its own attention)."""
    if numerics == "emulated" and dtype == "bfloat16" and device == "cpu" and not invariant and available():
        return NAME
    return None


def use_attention_kernel(model: torch.nn.Module) -> bool:
    """Let an emulating bf16 model's attention run the kernel (where `available`); True if it does."""
    from .numerics import emulated_dtype

    if emulated_dtype(model) is not torch.bfloat16 or not available():
        return False
    for layer in model.base_model.layers:
        setattr(layer.self_attn, KERNEL, True)
    return True


def applies(module, query: torch.Tensor, key: torch.Tensor, base_keys) -> bool:
    """Whether `grouped_attention` hands this call to the kernel: a module set up by `use_attention_kernel`,
    float32 tensors on the CPU, head_dim a multiple of 8 (every Llama's)."""
    return bool(getattr(module, KERNEL, False) and query.dtype == torch.float32 and key.dtype == torch.float32
                and query.device.type == "cpu" and query.shape[-1] % 8 == 0
                and (base_keys is None or base_keys.dtype == torch.float32))


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, base: tuple | None,
              mask: torch.Tensor | None, scale: float, flash_block: int = 0) -> torch.Tensor:
    """Attention output [rows, q_len, heads, head_dim] for bf16-rounded `query` [rows, heads, q_len, head_dim]
    over the cache's recent `key`/`value` and its older `base` part (or None), `mask` boolean
    [rows or 1, 1, q_len, columns] (True = attend) or None (every column). `flash_block` 0: eager numerics
    (rounded scores, softmax, rounded probabilities); N > 0: flash numerics over key blocks of N columns, those of
    `attention._flash_rounded`."""
    batch, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    group = heads // kv_heads
    exact = scale > 0 and math.frexp(scale)[0] == 0.5  # scaling the queries by a power of two first is exact
    q = (query * scale if exact else query).reshape(batch, kv_heads, group * q_len, dim).contiguous()
    parts = [base, (key, value)] if base is not None else [(key, value)]
    args: list = [q.data_ptr(), batch, kv_heads, group, q_len, dim]
    kept = []  # contiguous copies made here, alive until the call returns
    for keys, values in parts:
        if keys.stride(-1) != 1 or keys.stride(-2) != dim or values.stride() != keys.stride():
            keys, values = keys.contiguous(), values.contiguous()
            kept += [keys, values]
        args += [keys.data_ptr(), values.data_ptr(), keys.shape[2], keys.stride(0), keys.stride(1)]
    if len(parts) == 1:
        args += [None, None, 0, 0, 0]
    total = sum(k.shape[2] for k, _ in parts)
    if mask is not None:
        mask = mask[:, 0, -q_len:, -total:].contiguous().view(torch.uint8)
        args += [mask.data_ptr(), mask.shape[0]]
    else:
        args += [None, 0]
    out = torch.empty(batch, q_len, heads, dim, dtype=torch.float32)
    if _library().ta_attention(*args, 1.0 if exact else scale, flash_block, out.data_ptr()) != 0:
        raise MemoryError("attention kernel: out of memory for its scratch buffers")
    return out
