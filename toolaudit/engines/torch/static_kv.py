"""Static-shape KV: preallocated per-slot buffers written at position indices, the layout GPU engines use.

`kv.KVBatch` grows one shared cache by concatenation and keeps rows aligned with masked holes: fine for a CPU,
where every step's shapes may change at no cost, but on a GPU each new shape is a new set of kernel launches and
nothing can be captured as a CUDA graph. Here every layer owns buffers [slots, kv_heads, capacity, head_dim]
allocated once; a row lives in one slot and its token t sits at column t, so a step writes its new keys at the
rows' positions (`index_put_`), rejected proposals are undone by moving a length back (the next step overwrites
them) and a row leaving frees its slot without copying anything. The attention mask follows from the lengths
alone (column c is visible to a query at position p iff c <= p).

Two shape policies (`StaticKV(fixed=...)`):
- exact (CPU): a step runs the live slots only, over the columns the longest row needs: no work on padding.
- fixed (CUDA): a step runs a batch-size bucket of slots, a fixed width (1 for decoding, k+1 for verification,
  drafts padded) and every column, so a decode path sees a handful of shapes, each captured once as a CUDA graph
  (`graphs.StepGraphs`). With graphs or without, the same kernels see the same shapes: the same tokens.

Prompts are prefilled one at a time into their slot (a prompt's KV and first logits never depend on its batch),
starting from the prefix cache's KV copied into the slot's first columns.
"""

from __future__ import annotations

import time

import torch

from .kv import PAD_ID, real_positions_logits
from .numerics import emulated_dtype, round_to
from .prefix_cache import PathPrefix, PrefixCache, cached_start, prefill_seconds

COLUMN_STEP = 256  # capacity grows in multiples of this many columns
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # batch sizes a fixed-shape step runs (one graph each)


def bucket(rows: int, buckets: tuple[int, ...] = BUCKETS) -> int:
    """The smallest bucket that holds `rows` (the largest bucket if none does: callers cap rows by it)."""
    return next((b for b in buckets if b >= rows), buckets[-1])


def _round_up(columns: int) -> int:
    return -(-columns // COLUMN_STEP) * COLUMN_STEP


def kv_shape(model: torch.nn.Module) -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim) of a Llama-style model's cache."""
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_hidden_layers, config.num_key_value_heads, head_dim


class StaticCache:
    """The buffers and the `update` hook transformers' attention layers call (duck-typed as a `Cache`).

    Before each forward pass the owner sets which slots run (`lo:hi`), the column each new token goes to
    (`columns`, [hi - lo, width]) and how many columns attention reads (`span`). `update` writes there and returns
    views of the buffers: nothing is copied per step. Keys are rounded as they are cached on an emulating model
    (see `numerics`), as `attention.SplitLayer` does. The `get_*` methods serve transformers' mask builder for
    single-row prefill, the one forward run without an explicit 4D mask (it then keeps sdpa's causal fast path).
    """

    def __init__(self, model: torch.nn.Module, slots: int, capacity: int):
        layers, kv_heads, head_dim = kv_shape(model)
        weight = next(model.parameters())
        self.rounding = emulated_dtype(model)
        self.keys = [weight.new_zeros(slots, kv_heads, capacity, head_dim) for _ in range(layers)]
        self.values = [weight.new_zeros(slots, kv_heads, capacity, head_dim) for _ in range(layers)]
        self.is_sliding = [False] * layers
        self.is_compileable = False
        self.lo, self.hi, self.span, self.past = 0, slots, 0, 0
        self.columns: torch.Tensor | None = None
        self._rows: torch.Tensor | None = None

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def aim(self, lo: int, hi: int, columns: torch.Tensor, span: int, past: int = 0) -> None:
        """Where the next forward pass writes (`columns` per running slot) and how far attention reads."""
        self.lo, self.hi, self.columns, self.span, self.past = lo, hi, columns, span, past
        # Made anew each pass, not kept: under graph capture it must live in the graph's own memory pool.
        self._rows = torch.arange(hi - lo, device=columns.device)[:, None]

    def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
        if self.rounding is not None:
            key_states = round_to(key_states, self.rounding)
        keys, values = self.keys[layer_idx][self.lo:self.hi], self.values[layer_idx][self.lo:self.hi]
        keys[self._rows, :, self.columns] = key_states.transpose(1, 2)
        values[self._rows, :, self.columns] = value_states.transpose(1, 2)
        return keys[:, :, :self.span], values[:, :, :self.span]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.past

    def get_query_offset(self, layer_idx: int = 0) -> int:
        return self.past

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.past + query_length, 0

    def grow(self, capacity: int) -> None:
        """Reallocate every buffer with more columns (the old columns copied): rare, a row outgrew its estimate."""
        for store in (self.keys, self.values):
            for i, old in enumerate(store):
                new = old.new_zeros(*old.shape[:2], capacity, old.shape[3])
                new[:, :, : old.shape[2]] = old
                store[i] = new

    def move(self, source: int, target: int, length: int) -> None:
        """Copy a slot's first `length` columns into another slot (compaction)."""
        for store in (self.keys, self.values):
            for buffer in store:
                buffer[target, :, :length] = buffer[source, :, :length]

    def row_kv(self, slot: int, length: int) -> torch.Tensor:
        """A slot's first `length` columns as [layers, 2, kv_heads, length, head_dim] (a copy, for the prefix cache)."""
        return torch.stack([torch.stack([k[slot, :, :length], v[slot, :, :length]])
                            for k, v in zip(self.keys, self.values)])

    def load(self, slot: int, kv: torch.Tensor) -> None:
        """Write prompt KV ([layers, 2, kv_heads, n, head_dim]) into a slot's first n columns."""
        n = kv.shape[3]
        for index, (k, v) in enumerate(zip(self.keys, self.values)):
            k[slot, :, :n] = kv[index, 0]
            v[slot, :, :n] = kv[index, 1]


class StaticKV:
    """A batch of rows over a `StaticCache`, with the interface the decode loop and the draft proposer use
    (`admit`, `mark`, `extend`, `rollback`, `select`): loop rows map to slots (`slot_of`), lengths live on the
    host (no device sync to read them). `graphs` (a `graphs.StepGraphs`, fixed shapes only) replays captured steps.
    """

    def __init__(self, model: torch.nn.Module, max_rows: int, capacity: int, fixed: bool = False,
                 width: int = 1, graphs=None, buckets: tuple[int, ...] = BUCKETS, compiled: bool = False,
                 invariant: bool = False):
        self.model = model
        # Batch-invariant kernels (`invariant.py`) read spans in whole column blocks: views of the buffers, no copy.
        self.invariant = invariant
        self.device = next(model.parameters()).device
        self.fixed, self.width, self.graphs, self.buckets = fixed, width, graphs, buckets
        # The fixed-shape step through torch.compile: Inductor fuses the ~50 small kernels of a layer (norms,
        # rotary, masks, casts) that CUDA graphs alone still launch one by one. Fixed shapes only: few shapes.
        self._step = compiled_step(self._logits) if compiled and fixed else self._logits
        slots = bucket(max_rows, buckets) if fixed else max_rows
        # Fixed shapes read every column; their last one is a scratch column graph capture and warm-up write into
        # (inside the multiple of COLUMN_STEP: an odd row stride would misalign every row of every buffer).
        self.cache = StaticCache(model, slots, _round_up(capacity + (1 if fixed else 0)))
        self.lengths = [0] * slots  # valid tokens per slot
        self.slot_of: list[int] = []  # loop row -> slot
        self._mark: list[int] = []
        self.head = model.get_output_embeddings()

    @property
    def rows(self) -> int:
        return len(self.slot_of)

    def reset(self) -> StaticKV:
        """Empty every slot; the buffers (and captured graphs) stay for the next decode call."""
        self.lengths, self.slot_of, self._mark = [0] * len(self.lengths), [], []
        return self

    # -- rows joining and leaving ----------------------------------------------------------------------------
    def admit(self, prompts: list[list[int]], cache: PrefixCache | PathPrefix | None = None,
              slots: list[int] | tuple[int, ...] = ()) -> torch.Tensor:
        """Prefill one row per prompt; the first take the loop rows `slots` (finished: their slots are reused),
        the rest are appended. Returns the logits after each prompt, [new, vocab]."""
        used = set(self.slot_of)
        free = [s for s in range(len(self.lengths)) if s not in used]
        logits = []
        for index, prompt in enumerate(prompts):
            if index < len(slots):
                slot = self.slot_of[slots[index]]
            else:
                slot = free.pop(0)
                self.slot_of.append(slot)
            logits.append(self._prefill(slot, prompt, cache))
        return torch.stack(logits)

    def _prefill(self, slot: int, prompt: list[int], cache: PrefixCache | PathPrefix | None) -> torch.Tensor:
        """Fill a slot with one prompt from its longest cached prefix; the logits after it [vocab]. Only the
        uncached suffix runs, only its last position through the LM head; a prompt found whole runs nothing."""
        self._reserve(len(prompt) + 1)
        n, kv, logits = cached_start(cache, prompt)
        if n:
            self.cache.load(slot, kv)
        self.lengths[slot] = n
        if logits is not None:
            return logits
        started = time.perf_counter()
        suffix = prompt[n:]
        positions = torch.arange(n, len(prompt), device=self.device)[None]
        mask = None
        span = len(prompt)
        if self.invariant:  # whole column blocks, and the mask that says which are the prompt's
            span = _round_up(span)
            mask = (torch.arange(span, device=self.device)[None, :] <= positions[0, :, None])[None, None]
        self.cache.aim(slot, slot + 1, positions, span, past=n)
        hidden = self.model.base_model(input_ids=torch.tensor([suffix], device=self.device), position_ids=positions,
                                       attention_mask=mask, past_key_values=self.cache,
                                       use_cache=True).last_hidden_state
        # A 2D input to the LM head: a [1, 1, hidden] slice takes a batched-matmul path that copies the weight.
        logits = self.head(hidden[:, -1].contiguous())[0]
        self.lengths[slot] = len(prompt)
        if cache is not None:
            cache.insert(prompt, self.cache.row_kv(slot, len(prompt)), logits, prefill_seconds(started, logits), n)
        return logits

    def select(self, rows: list[int]) -> None:
        """Keep only these loop rows; freed slots are reused by later admissions. Rows in slots beyond the
        number of rows move down into free ones, so steps run as few slots as possible."""
        keep = [self.slot_of[r] for r in rows]
        for slot in set(self.slot_of) - set(keep):
            self.lengths[slot] = 0
        self.slot_of = keep
        free = sorted(set(range(len(keep))) - set(keep))
        for row, slot in enumerate(keep):
            if slot >= len(keep):
                target = free.pop(0)
                self.cache.move(slot, target, self.lengths[slot])
                self.lengths[target], self.lengths[slot] = self.lengths[slot], 0
                self.slot_of[row] = target

    # -- steps ----------------------------------------------------------------------------------------------
    def mark(self) -> None:
        """Remember each row's length; `rollback` keeps, per row, part of what follows."""
        self._mark = [self.lengths[s] for s in self.slot_of]

    def rollback(self, keep: list[int]) -> None:
        """Row i keeps its first keep[i] tokens since `mark()`: the rest is past its length, to be overwritten."""
        for slot, before, k in zip(self.slot_of, self._mark, keep):
            self.lengths[slot] = before + k

    def extend(self, tokens: list[list[int]], last_only: bool = False) -> torch.Tensor:
        """Append each row's tokens in one forward pass; logits [rows, width, vocab] (padding: zeros or unread)."""
        counts = [len(t) for t in tokens]
        width = max(counts)
        hi = max(self.slot_of) + 1
        if self.fixed:
            width = max(width, self.width)
            hi = bucket(hi, self.buckets)
        self._reserve(max(self.lengths[s] + width for s in self.slot_of) + 1)
        ids = [PAD_ID] * (width * hi)
        starts = [0] * hi
        for slot, row in zip(self.slot_of, tokens):
            ids[slot * width: slot * width + len(row)] = row
            starts[slot] = self.lengths[slot]
        # One host-to-device copy per step (ids, starts and slots packed), from pinned memory on a GPU.
        packed = torch.tensor(ids + starts + self.slot_of, dtype=torch.long)
        if self.device.type == "cuda":
            packed = packed.pin_memory().to(self.device, non_blocking=True)
        ids_t = packed[: width * hi].view(hi, width)
        positions = packed[width * hi: width * hi + hi, None] + torch.arange(width, device=self.device)
        index = packed[width * hi + hi:]
        for slot, n in zip(self.slot_of, counts):
            self.lengths[slot] += n
        if self.fixed:
            if self.graphs is not None:
                logits = self.graphs.step(self, ids_t, positions)
            else:
                logits = self.forward(ids_t, positions, self.cache.capacity)
            if self.slot_of == list(range(hi)):  # every slot is a row, in order: no gather
                return logits
            return logits[index]
        span = max(self.lengths[s] for s in self.slot_of)
        if self.invariant:
            span = _round_up(span)  # whole column blocks (the capacity is a multiple of them)
        real = None
        if any(c != width for c in counts):
            real = torch.arange(width, device=self.device)[None, :] < torch.tensor(counts, device=self.device)[:, None]
        return self.forward(ids_t, positions, span, rows=index, real=real)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, span: int, rows: torch.Tensor | None = None,
                real: torch.Tensor | None = None) -> torch.Tensor:
        """One pass over slots [0, len(ids)) writing at `positions`, attention over `span` columns.

        Logits for every slot and position ([slots, width, vocab], what a captured graph computes), or with `rows`
        only those slots', and with `real` ([rows, width]) only real positions go through the LM head."""
        self.cache.aim(0, ids.shape[0], positions, span)
        if rows is None:
            return self._step(ids, positions, span)
        hidden = self._hidden(ids, positions, span)[rows]
        return self.head(hidden) if real is None else real_positions_logits(self.head, hidden, real)

    def _hidden(self, ids: torch.Tensor, positions: torch.Tensor, span: int) -> torch.Tensor:
        mask = (torch.arange(span, device=self.device)[None, None, :] <= positions[:, :, None])[:, None]
        return self.model.base_model(input_ids=ids, position_ids=positions, attention_mask=mask,
                                     past_key_values=self.cache, use_cache=True).last_hidden_state

    def _logits(self, ids: torch.Tensor, positions: torch.Tensor, span: int) -> torch.Tensor:
        return self.head(self._hidden(ids, positions, span))

    def _reserve(self, columns: int) -> None:
        """Grow the buffers when a row would pass the last column (fixed shapes keep the scratch column free)."""
        need = columns + (1 if self.fixed else 0)
        if need > self.cache.capacity:
            self.cache.grow(_round_up(need))
            if self.graphs is not None:
                self.graphs.clear()  # captured for the old buffers: captured again at their next use


RECOMPILE_LIMIT = 64  # shapes per compiled step: buckets x widths x capacities (torch's default 8 would fall back)


def compiled_step(step):
    """`torch.compile` of a fixed-shape step. Shapes that change after the first compile (another bucket, a grown
    capacity) are compiled once more with symbolic sizes (automatic dynamic shapes), so a replay compiles a few
    times, not once per bucket; captured as CUDA graphs afterwards like the eager step."""
    import torch._dynamo

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), RECOMPILE_LIMIT))
    return torch.compile(step)
