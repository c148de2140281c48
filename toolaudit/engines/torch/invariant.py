"""Batch-invariant kernels: a row's numbers do not depend on which other rows, or how many positions, share its
forward pass (the path key `batch_invariant = true`).

Why: in bf16, batch composition alone moves greedy outputs (the same path at batch 16 and at batch 1 differed on
7 of 32 demo calls, as often as speculation did), so a drift figure mixes the candidate's doing with batching
noise. The causes are reductions whose order follows the shapes: a GEMM picks its kernel and blocking from the
row count (oneDNN's bf16 LM head at 48+ rows, its float32 down projection at 2+ rows give other bits than one
row alone), and attention reduces over as many columns as the longest row has. vLLM (`VLLM_BATCH_INVARIANT`) and
SGLang's deterministic mode fix the same thing with kernels of fixed reduction order; here, with fixed shapes:

- every linear runs on tiles of exactly `TILE` rows (the last padded with zeros), one product per tile, so a
  row meets the same kernel on the same shape wherever it sits: measured bit-identical at every position of a
  tile, for every projection of SmolLM2 in bf16 and float32 on oneDNN's prepacked kernels;
- attention scores run per tile of `TILE` query rows; softmax and the value product run over a span padded to a
  multiple of `COLUMN_BLOCK` columns (masked columns weigh exactly 0), the value product block by block in
  float32 and summed in block order: a query's result depends on its own columns only, not on how long the
  longest row of the batch is, nor on how many positions its row computes in the pass.

The last point makes a k+1-wide verification pass compute each position as a one-token step would: speculative
decoding becomes exact in low precision too (what the fixed-shape CUDA layout showed on an H100). The cost is
the padding and the per-tile launches; `docs/benchmarks.md` measures it.
"""

from __future__ import annotations

import functools
import types
from functools import partial

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from .numerics import ROUND_TO, round_to

ATTENTION = "toolaudit-invariant"
TILE = 16  # rows per GEMM tile (AMX's tile height: a one-row product costs about what sixteen do)
COLUMN_BLOCK = 256  # columns per block of the value product (the static cache grows by this step too)


def tiled(x: torch.Tensor, product) -> torch.Tensor:
    """`product(x)` for x [..., rows, k] computed on tiles of exactly TILE rows of the flattened leading dims."""
    flat = x.reshape(-1, x.shape[-1])
    padded, tiles = _tile_rows(flat)
    out = torch.cat([product(padded[tile]) for tile in tiles])
    return out[:flat.shape[0]].reshape(*x.shape[:-1], out.shape[-1])


def tile_linears(model: torch.nn.Module) -> int:
    """Route every `nn.Linear` of `model` through `tiled` (after any prepacking: the tile calls its forward)."""
    count = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            inner = module.forward
            module.forward = types.MethodType(lambda self, x, inner=inner: tiled(x, inner), module)
            count += 1
    return count


def invariant_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention whose result for a query depends only on that query and its visible columns (see module doc).

    query [rows, heads, q, dim]; key/value [rows, kv_heads, span, dim] with span a multiple of COLUMN_BLOCK and
    attention_mask boolean [rows or 1, 1, >= q, span] (True = attend): what `StaticKV(invariant=True)` hands out
    for prompts and steps alike. Rounding as `grouped_attention` for emulating models (`numerics.ROUND_TO`).
    """
    rows, heads, q_len, dim = query.shape
    kv_heads, span = key.shape[1], key.shape[2]
    if span % COLUMN_BLOCK or attention_mask is None or attention_mask.dtype != torch.bool \
            or attention_mask.shape[-1] != span:
        raise ValueError("invariant_attention reads whole column blocks under an explicit boolean mask: run it on "
                         "StaticKV(invariant=True)")
    rounding = getattr(module, ROUND_TO, None)
    rnd = (lambda t: t) if rounding is None else partial(round_to, dtype=rounding)
    query = rnd(query)
    scale = scaling if scaling is not None else dim ** -0.5
    attention_mask = attention_mask[:, :, -q_len:]
    group = heads // kv_heads
    m = group * q_len
    q = query.reshape(rows, kv_heads, m, dim)
    scores = rnd(_scores(q, key))  # [rows, kv_heads, m, span]
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32)) * scale
    scores.view(rows, kv_heads, group, q_len, span).masked_fill_(~attention_mask[:, :, None], float("-inf"))
    probs = rnd(torch.softmax(scores, dim=-1).to(value.dtype))
    out = rnd(_values(probs, value).to(value.dtype)).view(rows, heads, q_len, dim)
    return out.transpose(1, 2).contiguous(), None


def _tile_rows(x: torch.Tensor) -> tuple[torch.Tensor, list[slice]]:
    """x [..., m, k] zero-padded along m to whole tiles of TILE rows, and the tiles' slices."""
    m = x.shape[-2]
    padded = -(-m // TILE) * TILE
    if padded != m:
        x = torch.nn.functional.pad(x, (0, 0, 0, padded - m))
    return x, [slice(i, i + TILE) for i in range(0, padded, TILE)]


def _scores(q: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """q @ key^T per tile of TILE query rows: each tile is one batched product over (row, kv head) entries, and a
    batched product computes each entry alike whatever the batch count (measured bit-identical); the keys are
    read transposed in place, not copied. A decode step has one or two tiles; a prompt's prefill more."""
    m = q.shape[-2]
    q, tiles = _tile_rows(q)
    keys_t = key.transpose(2, 3)
    return torch.cat([torch.matmul(q[..., tile, :], keys_t) for tile in tiles], dim=-2)[..., :m, :]


def _values(probs: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """probs @ value in float32, per tile of TILE query rows and per block of COLUMN_BLOCK columns, the blocks'
    products summed in block order: a block past a row's columns adds exactly 0, so the span's length (set by
    the longest row of the batch) changes nothing."""
    m, span = probs.shape[-2], probs.shape[-1]
    probs, tiles = _tile_rows(probs.float())
    values = value.float()
    out = []
    for tile in tiles:
        total = None
        for start in range(0, span, COLUMN_BLOCK):
            block = slice(start, start + COLUMN_BLOCK)
            part = torch.matmul(probs[..., tile, block], values[..., block, :])
            total = part if total is None else total + part
        out.append(total)
    return torch.cat(out, dim=-2)[..., :m, :]


@functools.lru_cache(maxsize=1)
def _register() -> None:
    AttentionInterface.register(ATTENTION, invariant_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)


def use_invariant_attention(model: torch.nn.Module) -> None:
    """Switch a model to `invariant_attention` (in place; `models.load_model` keeps such models apart). Its
    linears are tiled afterwards (`tile_linears`), once emulation and prepacking have set them up."""
    _register()
    model.set_attn_implementation(ATTENTION)
