"""The split KV cache layer and the attention kernel that reads it: two halves of one design, kept together.

`SplitLayer` keeps a layer's cache in two parts so a decode step appends to a short recent part instead of
copying the whole cache; `grouped_attention` scores both parts and merges them in one softmax. The layer hands
its base part to the attention call that follows through an attribute of the keys it returns (`BASE`): no
global or thread-local state, and nothing for a caller to wire up. `kv.new_cache` only builds `SplitLayer`s for
models that run this attention (`use_grouped_attention`).
"""

from __future__ import annotations

import math
from functools import partial

import torch
from transformers import AttentionInterface
from transformers.cache_utils import DynamicLayer
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from .numerics import ROUND_TO, round_to, rounded

ATTENTION = "toolaudit"  # the attention kernel the embedded engine runs (see `grouped_attention`)
SHORT_QUERY = 16  # queries up to this length (decode steps, verification passes) take the matmul path
WIDE_QUERY = 12  # query rows per key/value head (query heads x length) from which scores run as q @ keys^T
KV_BLOCK = 512  # keys per block of the emulated flash attention (torch's CPU flash kernel uses 512 too)
Q_BLOCK = 64  # queries per block of the emulated flash attention (for speed; see `_flash_rounded`)
BASE = "toolaudit_base"  # attribute of the keys `SplitLayer.update` returns: (base keys, base values)


class SplitLayer(DynamicLayer):
    """A cache layer in two parts: a `base` (prompts, rows that joined) and `keys`/`values`, the recent columns.

    transformers' `DynamicLayer` appends with `torch.cat`, copying the whole cache at every step; on CPU that
    copy was most of a 16-row decode step (it runs at a few GB/s). Here a step only appends to the short
    recent part; `grouped_attention` attends to both parts and merges them in one softmax, so nothing large is
    copied per step. `update` returns the recent part only, carrying the base as an attribute of the returned
    keys (`BASE`): this layer works with that attention only (`kv.new_cache` pairs them). Structural changes
    (rows joining or leaving) fold the parts. With `rounding` (emulated low-precision numerics, see `numerics`)
    new keys are rounded as they are cached: RoPE ran in float32, and a native path caches them in that dtype.
    """

    def __init__(self, rounding: torch.dtype | None = None):
        super().__init__()
        self.rounding = rounding

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.keys = key_states.new_zeros(*key_states.shape[:2], 0, key_states.shape[3])
        self.values = value_states.new_zeros(*value_states.shape[:2], 0, value_states.shape[3])
        self.base_keys = self.base_values = None

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.rounding is not None:
            key_states = rounded(key_states, self.rounding)
        self.keys = torch.cat([self.keys, key_states], dim=-2)
        self.values = torch.cat([self.values, value_states], dim=-2)
        if self.base_keys is not None:  # handed to the attention call that follows, with the keys it gets
            setattr(self.keys, BASE, (self.base_keys, self.base_values))
        return self.keys, self.values

    def get_seq_length(self) -> int:
        if not self.is_initialized:
            return 0
        return self.keys.shape[-2] + (0 if self.base_keys is None else self.base_keys.shape[-2])

    def full(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.base_keys is None:
            return self.keys, self.values
        return torch.cat([self.base_keys, self.keys], dim=-2), torch.cat([self.base_values, self.values], dim=-2)

    def set(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        if not self.is_initialized:
            self.lazy_initialization(keys, values)
        # Contiguous once here, or every step's matmul would copy a strided view (bf16 matmul needs it dense).
        self.base_keys, self.base_values = keys.contiguous(), values.contiguous()
        self.keys, self.values = self.base_keys[:, :, :0], self.base_values[:, :, :0]

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count of tokens to remove (transformers 5.x convention)")
        n = abs(tokens_to_remove)
        if n > self.keys.shape[-2]:
            self.set(*self.full())
            self.base_keys, self.base_values = self.base_keys[:, :, :-n], self.base_values[:, :, :-n]
        elif n:
            self.keys, self.values = self.keys[:, :, :-n], self.values[:, :, :-n]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self.set(*(t[indices] for t in self.full()))


def grouped_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention for the embedded engine, registered with transformers as "toolaudit".

    Why not sdpa: on CPU, PyTorch's flash kernel is slow for the short queries of decoding (one token per step,
    k+1 per verification pass): 2.5 ms per layer for 8 rows x 600 cached tokens, more than the layer's matmuls.
    Short queries here take two batched matmuls with the query heads of each key/value group stacked along the
    query axis (no repeat of the KV cache for grouped-query attention), softmax in float32 like HF's eager
    attention. With a `SplitLayer` cache the older columns sit in a separate base tensor: both parts are
    scored and share one softmax, so no step copies the whole cache. Long queries (prefill) go to sdpa, where
    its kernel is good. Masks are 4D booleans (True = attend), as built by `KVBatch` or by transformers' sdpa
    mask function. In float64 this equals sdpa exactly (the tests in tests/engines/torch run both).
    An emulating model's attention modules carry the dtype to round to (`numerics.ROUND_TO`): the query (after
    RoPE), the scores and probabilities, and the output are rounded where a native bf16 run writes bf16, and
    long queries take `_flash_rounded` (native sdpa's rounding) instead of float32 sdpa.
    """
    rounding = getattr(module, ROUND_TO, None)
    rnd = _same if rounding is None else partial(round_to, dtype=rounding)
    if rounding is not None:
        query = rounded(query, rounding)  # a no-op for `_rounded_rope`'s output
    batch, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    scale = scaling if scaling is not None else dim ** -0.5
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        attention_mask = attention_mask > torch.finfo(attention_mask.dtype).min / 2  # additive -> boolean
    base_keys, base_values = getattr(key, BASE, (None, None))  # a SplitLayer's older columns, if any
    if base_keys is not None and q_len > SHORT_QUERY:  # long queries are rare (prefill): join the parts
        key, value = torch.cat([base_keys, key], dim=2), torch.cat([base_values, value], dim=2)
        base_keys = base_values = None
    total = key.shape[2] + (0 if base_keys is None else base_keys.shape[2])  # after the join: all columns
    if q_len > SHORT_QUERY and rounding is not None:
        if attention_mask is None:
            attention_mask = _causal(q_len, total, query.device)
        out = _flash_rounded(query, key, value, attention_mask[:, :, -q_len:, -total:], scale, rnd)
        return out.transpose(1, 2).contiguous(), None
    if q_len > SHORT_QUERY:
        causal = attention_mask is None and q_len == total  # a whole prompt: sdpa's fastest case
        if attention_mask is None and not causal:
            attention_mask = _causal(q_len, total, query.device)
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, is_causal=causal, scale=scale,
            enable_gqa=heads != kv_heads)
        return out.transpose(1, 2).contiguous(), None
    if attention_mask is None and q_len > 1:
        attention_mask = _causal(q_len, total, query.device)
    group = heads // kv_heads
    q = query.reshape(batch, kv_heads, group * q_len, dim)  # heads of a group share their keys and values
    # Scaling q first by a power of two gives the same bits as scaling the scores (rounded to bf16 or not; fp16's
    # narrow range would not keep that exact), one pass over the scores cheaper.
    scaled = (query.dtype in (torch.float32, torch.float64) and rounding in (None, torch.bfloat16)
              and _power_of_two(scale))
    if scaled:
        q = q * scale
    scores = rnd(_scores(q, key))
    if base_keys is not None:
        scores = torch.cat([rnd(_scores(q, base_keys)), scores], dim=-1)
    if not scaled:  # a native low-precision model's scores: upcast to float32 with the scale, as eager does
        scores = scores.to(torch.promote_types(scores.dtype, torch.float32)) * scale
    if attention_mask is not None:  # `scores` is a new tensor here: masked in place
        mask = attention_mask[:, :, -q_len:, -total:]  # [rows or 1, 1, q_len, total]
        scores.view(batch, kv_heads, group, q_len, total).masked_fill_(~mask[:, :, None], float("-inf"))
    probs = rnd(torch.softmax(scores, dim=-1).to(value.dtype))
    if base_keys is None:
        out = rnd(torch.matmul(probs, value))
    else:
        # The two parts' value products are added before the one rounding, as flash-decoding kernels combine
        # float32 partials: an emulating model's products are float32, so where the split falls stays out of its
        # numerics. A native low-precision model's products come out rounded, which is why `kv` folds its cache.
        split = base_keys.shape[2]
        out = rnd(torch.matmul(probs[..., :split], base_values) + torch.matmul(probs[..., split:], value))
    out = out.view(batch, heads, q_len, dim)
    return out.transpose(1, 2).contiguous(), None


def _flash_rounded(query, key, value, mask, scale: float, rnd) -> torch.Tensor:
    """Flash attention's low-precision numerics on float32 kernels, for emulated prefill; [batch, heads, q, dim].

    Native bf16 sdpa on CPU (like flash attention on GPUs) keeps scores, running max and softmax sum in
    float32 but multiplies the values by exp(score - running max) rounded to bf16, block by block of keys,
    and divides by the sum at the end. Doing the same matches native outputs bit for bit on ~97% of elements
    (rounding float32 sdpa's output: ~80%). `mask` is boolean [rows or 1, 1, q_len, keys].

    Queries go `Q_BLOCK` at a time so each block's scores stay in cache (2-3x faster than whole-prompt score
    matrices), and a query block stops at the last key it can see, as the native kernel does for causal
    prompts: masked keys add nothing, and key blocks still start at multiples of `KV_BLOCK` (only float32
    summation order in the value product can change: ~2e-5 of outputs round to a neighbouring bf16 value).
    """
    q_len, total = query.shape[2], key.shape[2]
    visible = mask.any(dim=1).any(dim=0)  # [q_len, keys]: keys some row's query may attend to
    parts = []
    for qs in range(0, q_len, Q_BLOCK):
        qe = min(qs + Q_BLOCK, q_len)
        seen = visible[qs:qe].any(0).nonzero()
        last = int(seen[-1]) + 1 if len(seen) else total
        parts.append(_flash_block(query[:, :, qs:qe], key[:, :, :last], value[:, :, :last],
                                  mask[:, :, qs:qe, :last], scale, rnd))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)


def _flash_block(query, key, value, mask, scale: float, rnd) -> torch.Tensor:
    """`_flash_rounded` for one block of queries: key blocks of `KV_BLOCK`, one running max and sum."""
    batch, heads, q_len, dim = query.shape
    kv_heads, total = key.shape[1], key.shape[2]
    group = heads // kv_heads
    q = query.reshape(batch, kv_heads, group * q_len, dim)  # heads of a group share their keys and values
    exact = _power_of_two(scale)  # scaling q first is exact, and cheaper
    if exact:
        q = q * scale
    # The batched GEMMs below split their batch over threads: 3 key/value heads on 2 threads leave one idle a
    # third of the time, so the query rows go in `split` parts (each part still meets every key it saw).
    threads = torch.get_num_threads()
    split = threads // math.gcd(batch * kv_heads, threads)
    if split > 1 and (group * q_len) % split == 0:
        q = q.view(batch, kv_heads, split, group * q_len // split, dim)
        key, value = key[:, :, None], value[:, :, None]
    hidden = ~mask[:, :, None]  # [rows or 1, 1, 1, q_len, keys]: True where a key is masked
    acc_shape = (batch, kv_heads, group * q_len, dim)
    acc = norm = top = None
    for start in range(0, total, KV_BLOCK):
        end = min(start + KV_BLOCK, total)
        scores = torch.matmul(q, key[..., start:end, :].transpose(-1, -2)).view(batch, kv_heads, group * q_len, -1)
        if not exact:
            scores.mul_(scale)
        if bool(hidden[..., start:end].any()):  # most key blocks of a prompt's suffix are all visible
            scores.view(batch, kv_heads, group, q_len, end - start).masked_fill_(hidden[..., start:end], -math.inf)
        new_top = scores.amax(-1, keepdim=True)
        if top is not None:
            new_top = torch.maximum(top, new_top)
        shift = torch.where(new_top == float("-inf"), 0.0, new_top)  # rows with every key so far masked
        weights = scores.sub_(shift).exp_()
        part = torch.matmul(rnd(weights).view(*q.shape[:-1], -1), value[..., start:end, :]).view(acc_shape)
        sums = weights.sum(-1, keepdim=True)
        if acc is None:
            acc, norm = part, sums
        else:
            decay = torch.exp(top - shift)
            acc, norm = acc.mul_(decay).add_(part), norm.mul_(decay).add_(sums)
        top = new_top
    return rnd(acc / norm).view(batch, heads, q_len, dim)


def split_in_numerics(keys: torch.Tensor) -> bool:
    """Whether attention over a split cache of `keys` depends on where the split falls: low-precision keys (a
    native bf16/fp16 model) give each part's value product already rounded before the two are added; float32
    ones (float32 and emulating models) add float32 products before one rounding."""
    return keys.dtype in (torch.bfloat16, torch.float16)


def _scores(q: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """q @ keys^T for short queries. A decode step's few query rows (up to `WIDE_QUERY`) go as keys @ q^T: the
    keys [rows, kv_heads, columns, dim] read in the layout they are stored in, ~10% faster there; a
    verification pass's wider block is ~20% faster as q @ keys^T (30 layers of a 16-row cache, AVX2 kernels)."""
    if q.shape[2] >= WIDE_QUERY:
        return torch.matmul(q, keys.transpose(2, 3))
    return torch.matmul(keys, q.transpose(2, 3)).transpose(2, 3).contiguous()


def _power_of_two(scale: float) -> bool:
    return scale > 0 and math.frexp(scale)[0] == 0.5


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


def _causal(q_len: int, kv_len: int, device):
    """Causal mask [1, 1, q_len, kv_len] for queries that are the last q_len of the keys."""
    keys = torch.arange(kv_len, device=device)
    return (keys[None, :] <= torch.arange(kv_len - q_len, kv_len, device=device)[:, None])[None, None]


def use_grouped_attention(model) -> None:
    """Register `grouped_attention` (with sdpa's mask builder) and switch the model to it."""
    AttentionInterface.register(ATTENTION, grouped_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)
    model.set_attn_implementation(ATTENTION)
