"""A batch of ragged sequences in one KV cache: what lets one forward pass serve every row of a decode step.

Rows are ragged (a prompt length, a number of proposals, an accepted prefix), so a `KVBatch` keeps one shared
cache plus a per-row validity mask: padding and rejected proposals become masked "holes" instead of forcing
rows apart, and trailing columns no row needs are cropped. Rows join (continuous batching) and leave in place.
The numerics stay those of a real batched pass (what a serving engine does).
"""

from __future__ import annotations

import time

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from toolaudit import ConfigError

from .attention import ATTENTION, SplitLayer, split_in_numerics
from .numerics import emulated_dtype
from .prefix_cache import PathPrefix, PrefixCache, cached_start, prefill_seconds

PAD_ID = 0  # any id works: padded positions are masked out of attention and their logits are never read


def new_cache(model: torch.nn.Module) -> DynamicCache:
    """A `DynamicCache` for a full-attention model: masked holes and rollback assume that every layer sees every
    column (a sliding window would count holes as tokens). With the engine's own attention the layers are
    `SplitLayer`s (no whole-cache copy per step; an emulating model's layers round the keys they cache), with any
    other attention transformers' `DynamicLayer`s.
    """
    cache = DynamicCache(config=model.config)
    if any(type(layer) is not DynamicLayer for layer in cache.layers):
        raise ConfigError(f"{type(model).__name__}: the embedded engine supports full-attention models only "
                          f"(cache layers: {sorted({type(layer).__name__ for layer in cache.layers})})")
    if getattr(model.config, "_attn_implementation", None) == ATTENTION:
        cache.layers = [SplitLayer(emulated_dtype(model)) for _ in cache.layers]
    return cache


def _full(layer: DynamicLayer) -> tuple[torch.Tensor, torch.Tensor]:
    """A layer's whole keys and values, [rows, kv_heads, columns, head_dim]."""
    return layer.full() if isinstance(layer, SplitLayer) else (layer.keys, layer.values)


def _parts(layer: DynamicLayer) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A layer's keys and values as the parts it holds, oldest columns first (a `SplitLayer`: base, recent)."""
    if isinstance(layer, SplitLayer) and layer.base_keys is not None:
        return [(layer.base_keys, layer.base_values), (layer.keys, layer.values)]
    return [(layer.keys, layer.values)]


def _set_layer(layer: DynamicLayer, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Make these the layer's whole contents (used when rows join, move or leave)."""
    if isinstance(layer, SplitLayer):
        layer.set(keys, values)
        return
    if not layer.is_initialized:
        layer.lazy_initialization(keys, values)
    layer.keys, layer.values = keys, values


def _right_aligned(batches: list[list[tuple[torch.Tensor, torch.Tensor]]], width: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack several batches' (keys, values) along rows, each right-aligned to `width` columns behind zeros: one
    new tensor each, every batch's parts (`_parts`: a split layer's base and recent columns) written into it
    once (joining the parts first, or padding each batch and concatenating, copied everything twice)."""
    joined = []
    for side in (0, 1):
        first = batches[0][0][side]
        rows = sum(parts[0][side].shape[0] for parts in batches)
        out = first.new_empty(rows, first.shape[1], width, first.shape[3])
        row = 0
        for parts in batches:
            n = parts[0][side].shape[0]
            start = width - sum(p[side].shape[2] for p in parts)
            out[row:row + n, :, :start].zero_()
            for p in parts:
                cols = p[side].shape[2]
                out[row:row + n, :, start:start + cols] = p[side]
                start += cols
            row += n
        joined.append(out)
    return joined[0], joined[1]


def _joined(parts: list[tuple[torch.Tensor, torch.Tensor]], lead: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A layer's parts side by side without their first `lead` columns, in one copy (none where a single part
    remains: a view, which a split layer makes dense once in `SplitLayer.set`)."""
    joined = []
    for side in (0, 1):
        pieces, skip = [], lead
        for part in parts:
            t = part[side]
            if skip < t.shape[2]:
                pieces.append(t[:, :, skip:] if skip else t)
            skip = max(0, skip - t.shape[2])
        if not pieces:
            pieces = [parts[-1][side][:, :, :0]]
        joined.append(pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=2))
    return joined[0], joined[1]


def _write_row(parts: list[tuple[torch.Tensor, torch.Tensor]], slot: int,
               row: list[tuple[torch.Tensor, torch.Tensor]], start: int) -> None:
    """Write a one-row cache's parts, whose first column is the batch's column `start`, into row `slot` of the
    batch's parts (each copied once: joining the row's parts first copied them twice)."""
    src = start
    for new_keys, new_values in row:
        src_end = src + new_keys.shape[2]
        offset = 0
        for keys, values in parts:
            lo, hi = max(src, offset), min(src_end, offset + keys.shape[2])
            if lo < hi:
                keys[slot, :, lo - offset:hi - offset] = new_keys[0, :, lo - src:hi - src]
                values[slot, :, lo - offset:hi - offset] = new_values[0, :, lo - src:hi - src]
            offset += keys.shape[2]
        src = src_end


def compaction_moves(rows: list[int]) -> tuple[list[int], list[int]] | None:
    """For `select(rows)`: the (destination, source) rows that move when the staying rows can be compacted in
    place (each row either stays where it is or comes from past the new end, as `loop.compaction` orders
    them), else None."""
    kept = len(rows)
    if any(r != i and r < kept for i, r in enumerate(rows)):
        return None
    moved = [(i, r) for i, r in enumerate(rows) if r != i]
    return [d for d, _ in moved], [s for _, s in moved]


def real_positions_logits(head: torch.nn.Module, hidden: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Logits [rows, width, vocab] of a ragged block whose real positions are `real` ([rows, width]): only those
    go through the LM head (as one product); padding positions get zeros, which are never read."""
    real_logits = head(hidden[real])
    logits = real_logits.new_zeros(*real.shape, real_logits.shape[-1])
    logits[real] = real_logits
    return logits


class KVBatch:
    """A batch of sequences in one `DynamicCache`, with a [rows, columns] validity mask over cache columns.

    Columns are cache slots; a row's real tokens are its valid columns, in order. Left padding (rows joined
    with shorter prompts) and rejected proposals are invalid columns that attention never sees. Positions (for
    RoPE) are per-row counts of valid tokens, so a hole does not shift later positions.

    Prompts are prefilled one row at a time, then joined: a prompt's KV and first logits never depend on which
    requests shared its batch (batched prefill was no faster per token on CPU in any case).
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.device = next(model.parameters()).device
        self.cache = new_cache(model)
        self.valid = torch.zeros(0, 0, dtype=torch.bool, device=self.device)
        self.lengths = torch.zeros(0, dtype=torch.long, device=self.device)  # valid tokens per row
        self.dense = True  # every column valid for every row: HF can build its own (cheaper) causal mask
        self._mark_cols = 0
        self._mark_lengths = self.lengths

    @property
    def rows(self) -> int:
        return self.valid.shape[0]

    @property
    def columns(self) -> int:
        return self.valid.shape[1]

    def admit(self, prompts: list[list[int]], cache: PrefixCache | PathPrefix | None = None,
              slots: list[int] | tuple[int, ...] = ()) -> torch.Tensor:
        """Add one row per prompt; return the logits after each prompt, [new, vocab].

        The first prompts go into `slots` (rows that finished: overwritten in place, so continuous batching
        does not copy the whole cache per admission), the rest are appended after the current rows.
        """
        logits, rows = [], []
        for prompt in prompts:
            row = KVBatch(self.model)
            logits.append(row._prefill_one(prompt, cache))
            rows.append(row)
        if slots:
            self._overwrite(list(slots), rows[: len(slots)])
        if len(rows) > len(slots):
            self._join(rows[len(slots):])
        return torch.stack(logits)

    def _overwrite(self, slots: list[int], rows: list[KVBatch]) -> None:
        """Put one-row batches into existing rows, right-aligned to the current last column."""
        width = max(r.columns for r in rows)
        if width > self.columns:
            self._pad_left(width - self.columns)
        end = self.columns
        self.valid, self.lengths = self.valid.clone(), self.lengths.clone()
        for index, mine in enumerate(self.cache.layers):
            parts = _parts(mine)
            # Where the split of a native bf16/fp16 cache falls is part of its numerics (`split_in_numerics`),
            # so it stays where it was measured: all columns in the base after an admission (a fold, one copy of
            # the whole cache). Writing in place instead moved the native demo's drift from 21 to 26 of 180
            # calls. Other caches are written in place: admissions 8.6 s -> 3.3 s of the AVX2-kernel demo.
            fold = isinstance(mine, SplitLayer) and split_in_numerics(parts[0][0])
            for slot, row in zip(slots, rows):
                _write_row(parts, slot, _parts(row.cache.layers[index]), end - row.columns)
            if fold:
                _set_layer(mine, *_full(mine))
        for slot, row in zip(slots, rows):
            n = row.columns
            self.valid[slot] = False
            self.valid[slot, end - n:] = True
            self.lengths[slot] = n
        self._trim_leading()

    def _prefill_one(self, prompt: list[int], cache: PrefixCache | PathPrefix | None) -> torch.Tensor:
        """Fill this (empty) batch with one prompt, starting from its longest cached prefix; its logits [vocab].

        Only the uncached suffix runs, and only its last position goes through the LM head. A prompt found
        whole, with the logits after it, runs nothing: a second path replaying it starts from the same bits.
        """
        n, kv, logits = cached_start(cache, prompt)
        self._load(kv if n else None)
        if logits is not None:
            return logits
        started = time.perf_counter()
        logits = self.extend([prompt[n:]], last_only=True)[0, -1]
        if cache is not None:
            cache.insert(prompt, self.row_kv(0), logits, prefill_seconds(started, logits), n)
        return logits

    def _load(self, kv: torch.Tensor | None) -> None:
        """Start a one-row batch from prompt KV ([layers, 2, kv_heads, n, head_dim]) or from nothing."""
        n = 0 if kv is None else kv.shape[3]
        self.valid = torch.ones(1, n, dtype=torch.bool, device=self.device)
        self.lengths = torch.tensor([n], dtype=torch.long, device=self.device)
        self.dense = True
        if kv is not None:
            for index, layer in enumerate(self.cache.layers):
                _set_layer(layer, kv[index, 0][None], kv[index, 1][None])

    def _join(self, others: list[KVBatch]) -> None:
        """Append the rows of `others` in one copy; rows with fewer columns are padded on the left (invalid)."""
        parts = ([self] if self.rows else []) + others
        width = max(b.columns for b in parts)
        if len(parts) > 1:
            for layer_parts in zip(*(b.cache.layers for b in parts)):
                _set_layer(layer_parts[0], *_right_aligned([_parts(layer) for layer in layer_parts], width))
        elif parts[0].columns < width:
            parts[0]._pad_left(width - parts[0].columns)
        self.cache = parts[0].cache
        self.valid = torch.cat([torch.nn.functional.pad(b.valid, (width - b.columns, 0)) for b in parts])
        self.lengths = torch.cat([b.lengths for b in parts])
        self.dense = bool(self.valid.all())

    def _pad_left(self, width: int) -> None:
        """Prepend `width` invalid columns."""
        for layer in self.cache.layers:
            parts = _parts(layer)
            keys = parts[0][0]
            pad = keys.new_zeros(*keys.shape[:2], width, keys.shape[3])
            _set_layer(layer, *_joined([(pad, pad), *parts]))  # one copy of the parts behind the zeros
        self.valid = torch.cat([self.valid.new_zeros(self.rows, width), self.valid], dim=1)
        self.dense = False

    def row_kv(self, row: int) -> torch.Tensor:
        """Row `row`'s valid KV as [layers, 2, kv_heads, tokens, head_dim] (a copy, for the prefix cache)."""
        if not bool(self.valid[row].all()):
            cols = self.valid[row].nonzero().squeeze(1)
            return torch.stack([torch.stack([keys[row][:, cols], values[row][:, cols]])
                                for keys, values in map(_full, self.cache.layers)])
        # A prompt just prefilled (every column valid): each part is written once, without joining them first.
        layers = [_parts(layer) for layer in self.cache.layers]
        first = layers[0][0][0]
        out = first.new_empty(len(layers), 2, first.shape[1], self.columns, first.shape[3])
        for index, parts in enumerate(layers):
            start = 0
            for keys, values in parts:
                end = start + keys.shape[2]
                out[index, 0, :, start:end], out[index, 1, :, start:end] = keys[row], values[row]
                start = end
        return out

    def extend(self, tokens: list[list[int]], last_only: bool = False) -> torch.Tensor:
        """Append each row's tokens (ragged rows right-padded into one block); return logits [rows, width, vocab].

        With `last_only` (single-row prefill) only the last position goes through the LM head.
        """
        width = max(len(t) for t in tokens)
        rows = len(tokens)
        counts = [len(t) for t in tokens]
        ragged = any(c != width for c in counts)
        if ragged:
            ids = torch.tensor([t + [PAD_ID] * (width - len(t)) for t in tokens], dtype=torch.long,
                               device=self.device)
            n = torch.tensor(counts, device=self.device)
            block_valid = torch.arange(width, device=self.device)[None, :] < n[:, None]
        else:
            ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
            n = width
            block_valid = torch.ones(rows, width, dtype=torch.bool, device=self.device)
        positions = self.lengths[:, None] + torch.arange(width, device=self.device)[None, :]
        self.valid = torch.cat([self.valid, block_valid], dim=1)
        self.lengths = self.lengths + n
        self.dense = self.dense and not ragged
        return self._forward(ids, positions, width, last_only, block_valid if ragged else None)

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, width: int, last_only: bool = False,
                 real: torch.Tensor | None = None):
        """Logits [rows, width or 1, vocab]. `real` ([rows, width], ragged blocks only): the positions that hold
        tokens; only those go through the LM head, and padding positions get zero logits (never read)."""
        mask = None if self.dense else self._mask(width)
        if not last_only and real is None:
            return self.model(input_ids=ids, position_ids=positions, attention_mask=mask,
                              past_key_values=self.cache, use_cache=True).logits
        hidden = self.model.base_model(input_ids=ids, position_ids=positions, attention_mask=mask,
                                       past_key_values=self.cache, use_cache=True).last_hidden_state
        head = self.model.get_output_embeddings()
        if last_only:
            # Not `logits_to_keep=1`: its [rows, 1, hidden] slice sends the LM head down a batched-matmul path that
            # copies the whole 49152 x 576 weight first (100 ms per prefill on CPU). A 2D input avoids that.
            return head(hidden[:, -1].contiguous())[:, None]
        # A verification pass whose rows propose different numbers of tokens: padding was ~12% of the demo's
        # verification positions, and the LM head is a fifth of a position's cost. The real positions still go
        # through the LM head as one product (fewer rows, as any other batch shape would).
        return real_positions_logits(head, hidden, real)

    def _mask(self, width: int) -> torch.Tensor:
        """A 4D boolean mask [rows, 1, width, columns]: causal, restricted to valid columns.

        Each query also sees its own column, so a padding query never has an all-masked row (that would
        produce NaN keys/values which, multiplied by a zero weight, would still poison real rows).
        """
        cols, past = self.columns, self.columns - width
        q = torch.arange(width, device=self.device)
        causal = torch.arange(cols, device=self.device)[None, :] <= (past + q)[:, None]  # [width, cols]
        mask = self.valid[:, None, None, :] & causal[None, None]
        mask[:, :, q, past + q] = True
        return mask

    def mark(self) -> None:
        """Remember the current end; `rollback` then decides, per row, how much of what follows to keep."""
        self._mark_cols = self.columns
        self._mark_lengths = self.lengths

    def rollback(self, keep: list[int]) -> None:
        """Keep only each row's first `keep[i]` valid tokens added since `mark()`; crop columns nobody needs."""
        tail = self.valid[:, self._mark_cols:]
        keep_t = torch.tensor(keep, device=self.device)
        rank = tail.cumsum(1)  # 1-based index of each valid token in the tail
        new_tail = tail & (rank <= keep_t[:, None])
        self.valid = torch.cat([self.valid[:, : self._mark_cols], new_tail], dim=1)
        self.lengths = self._mark_lengths + keep_t
        used = new_tail.any(0).nonzero()
        drop = tail.shape[1] - (int(used[-1]) + 1 if len(used) else 0)
        if drop:
            self.cache.crop(-drop)  # transformers 5.x: a negative count of tokens to remove
            self.valid = self.valid[:, : self.columns - drop]
        self.dense = bool(self.valid.all())

    def select(self, rows: list[int]) -> None:
        """Keep only these rows, in this order (finished rows leave when no prompt is waiting for their slot).

        Ordered as `loop.compaction` orders them, only the rows that move are copied, into the places of rows
        that left, and the cache keeps its first rows; in any other order every kept row is gathered."""
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        self.valid = self.valid[index]
        self.lengths = self.lengths[index]
        moves = compaction_moves(rows)
        if moves is None:
            self.cache.batch_select_indices(index)
            self._trim_leading()
            return
        lead = self._lead()
        destination, source = (torch.tensor(m, dtype=torch.long, device=self.device) for m in moves)
        for layer in self.cache.layers:
            parts = _parts(layer)
            if len(destination):
                for keys, values in parts:
                    keys[destination], values[destination] = keys[source], values[source]
            # Folded and trimmed in one copy, as a gather would have left them (the same columns, the same bits).
            _set_layer(layer, *_joined([(k[: len(rows)], v[: len(rows)]) for k, v in parts], lead))
        self.valid = self.valid[:, lead:]
        self.dense = bool(self.valid.all())

    def _lead(self) -> int:
        """Leading columns no row uses."""
        used = self.valid.any(0).nonzero()
        return int(used[0]) if len(used) else 0

    def _trim_leading(self) -> None:
        """Drop leading columns no row uses any more. A split layer copies its parts once here (`SplitLayer.set`
        keeps its base dense for the step matmuls); a plain layer keeps a view."""
        lead = self._lead()
        if lead:
            for layer in self.cache.layers:
                _set_layer(layer, *_joined(_parts(layer), lead))
            self.valid = self.valid[:, lead:]
        self.dense = bool(self.valid.all())
