"""The decode loop over a Hugging Face causal LM: target-only and speculative, greedy and sampled, batched.

Why a loop of our own instead of `model.generate()`: toolaudit must show *where* two decode paths part, so every
generated token carries the top-1/top-2 margin of the logits that chose it, and speculative decoding must be
exactly "target greedy" in exact arithmetic. The tests prove that in float64 (speculative == target, token for
token); any difference seen in bf16 is then numerics (a batched verification pass reduces in another order than
one-token steps), not a bug in the loop.

One loop serves every path. Each step feeds every active row its pending token (the last one chosen, not yet in
the KV cache) plus that row's proposals (`proposers`), in ONE target forward pass over a `kv.KVBatch`;
target-only decoding is the same loop with no proposals. Batching is continuous: a finished row's slot goes to
the next prompt at once. With one row there are never holes in the cache.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..completion import ValueEnd
from .kv import KVBatch
from .prefix_cache import PathPrefix, PrefixCache
from .proposers import NewKV, Proposer
from .sampling import draw, warp


@dataclass(frozen=True)
class DecodeSettings:
    """How to decode one batch. `seeds` are per row so a sampled row does not depend on its batch neighbours."""

    max_tokens: int
    temperature: float = 0.0
    eos_ids: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()
    # A row also ends where the JSON value its answer opens with closes (`completion.ValueEnd`): a prefilled
    # tool call's JSON is the answer, and the close tag after it would cost ~6 more steps a row.
    value_end: bool = False
    piece: Callable[[int], str] | None = None  # token id -> text, needed for stop strings and `value_end`
    seeds: tuple[int, ...] | None = None
    top_p: float = 1.0
    top_k: int = 0
    # How a sampled row's verification logits [positions, vocab] and proposals become its emitted tokens: the
    # correct rejection sampler (`sample_tokens`) unless a test swaps in a broken one to show it is caught.
    sampler: Callable[..., list[int]] | None = None
    logprobs: int = 0  # > 0: record each step's top-k log-probabilities (log_softmax in float32); 0 costs nothing


@dataclass
class RowOutput:
    """What one row produced, with the per-token evidence (margins, top-2 ids) and cost counters."""

    token_ids: list[int] = field(default_factory=list)
    margins: list[float] = field(default_factory=list)
    top2: list[tuple[int, int]] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)  # with settings.logprobs only
    drafted: int = 0
    accepted: int = 0
    forward_passes: int = 0
    ttft_s: float = 0.0
    latency_s: float = 0.0
    finish_reason: str = "length"


class _Row:
    """Per-row bookkeeping: history (prompt + output), stop-string tail, output record, timing."""

    __slots__ = ("history", "out", "tail", "done", "generator", "admitted", "value")

    def __init__(self, prompt: list[int], generator: torch.Generator | None):
        self.history = list(prompt)
        self.out = RowOutput()
        self.tail = ""
        self.done = False
        self.generator = generator
        self.admitted = 0.0
        self.value = ValueEnd()


def decode(model: torch.nn.Module, prompts: list[list[int]], settings: DecodeSettings,
           proposer: Proposer | None = None, prefix_cache: PrefixCache | PathPrefix | None = None,
           batch_size: int | None = None, new_kv: NewKV | None = None) -> list[RowOutput]:
    """Decode prompts (token ids), one `RowOutput` each, in order. With `proposer`, speculatively.

    At most `batch_size` rows decode together (default: all). Continuous batching: when a row finishes, the
    next prompt takes its place at once, so a long answer does not hold a whole batch hostage. Prompts are
    admitted in the order given. `prefix_cache` supplies and receives prompt KV. `new_kv(rows, columns, width)`
    makes the batch's KV cache (default: a growing `KVBatch`; the engine passes static-shape ones, `static_kv`).
    """
    if not prompts:
        return []
    batch_size = batch_size or len(prompts)
    if new_kv is None:
        new_kv = lambda rows, columns, width: KVBatch(model)  # noqa: E731
    width = 1 + (proposer.k if proposer is not None else 0)
    columns = max(len(p) for p in prompts) + settings.max_tokens + width
    rows = min(batch_size, len(prompts))
    if proposer is not None:
        proposer.reserve(rows, columns)
    with torch.inference_mode():
        return _decode(model, prompts, settings, proposer, prefix_cache, batch_size, new_kv(rows, columns, width))


def _decode(model, prompts, settings, proposer, prefix_cache, batch_size, kv):
    sampling = settings.temperature > 0
    device = next(model.parameters()).device
    seeds = settings.seeds or tuple(range(len(prompts)))
    rows = [_Row(p, torch.Generator(device).manual_seed(int(s)) if sampling else None)
            for p, s in zip(prompts, seeds)]
    stop_len = max((len(s) for s in settings.stop_strings), default=0)
    value_end = settings.value_end and settings.piece is not None

    def emit(row: _Row, token: int, margin: float, pair: tuple[int, int], top: list | None) -> bool:
        """Record one generated token; True when the row is finished (EOS, stop string, max_tokens)."""
        out = row.out
        out.token_ids.append(token)
        out.margins.append(margin)
        out.top2.append(pair)
        if top is not None:
            out.top_logprobs.append(top)
        row.history.append(token)
        if token in settings.eos_ids:
            out.finish_reason, row.done = "stop", True
        elif value_end and row.value.feed(settings.piece(token)) is not None:
            out.finish_reason, row.done = "stop", True
        elif stop_len and settings.piece is not None:
            row.tail = (row.tail + settings.piece(token))[-(stop_len + 32):]
            if any(s in row.tail for s in settings.stop_strings):
                out.finish_reason, row.done = "stop", True
        if not row.done and len(out.token_ids) >= settings.max_tokens:
            out.finish_reason, row.done = "length", True
        if row.done:
            out.latency_s = time.perf_counter() - row.admitted
        return row.done

    queue = list(range(len(rows)))[::-1]  # popped from the end: admission in the given order
    active: list[int] = []  # row ids, in the order of the batch's rows
    while True:
        done = [j for j, i in enumerate(active) if rows[i].done]
        free = batch_size - len(active) + len(done)
        if queue and free:
            new = [queue.pop() for _ in range(min(free, len(queue)))]
            slots = done[: len(new)]
            now = time.perf_counter()
            logits = kv.admit([rows[i].history for i in new], prefix_cache, slots)
            if proposer is not None:
                proposer.admit([rows[i].history for i in new], slots)
            ttft = time.perf_counter()
            for slot, i in zip(slots, new):
                active[slot] = i
            active += new[len(slots):]
            chosen, margins, pairs, tops = _choose(logits[:, None, :], [[] for _ in new], [rows[i] for i in new],
                                                   settings, None)
            for j, i in enumerate(new):
                rows[i].admitted = now
                rows[i].out.ttft_s = ttft - now
                rows[i].out.forward_passes = 1
                emit(rows[i], chosen[j][0], margins[j][0], pairs[j][0], tops[j][0] if tops else None)
            continue  # rows that finished on their first token make room before the next step
        if done:
            keep_rows = compaction(len(active), done)
            kv.select(keep_rows)
            if proposer is not None:
                proposer.select(keep_rows)
            active = [active[j] for j in keep_rows]
        if not active:
            break
        batch = [rows[i] for i in active]
        if proposer is not None:
            budgets = [settings.max_tokens - len(r.out.token_ids) for r in batch]
            gens = [r.generator for r in batch] if sampling else None
            drafts, dists = proposer.propose([r.history for r in batch], budgets, gens)
        else:
            drafts, dists = [[] for _ in batch], None
        kv.mark()
        logits = kv.extend([[r.history[-1]] + d for r, d in zip(batch, drafts)])
        chosen, margins, pairs, tops = _choose(logits, drafts, batch, settings, dists)
        keep, accepted_counts = [], []
        for i, (r, d, c, m, s) in enumerate(zip(batch, drafts, chosen, margins, pairs)):
            accepted = len(c) - 1  # every chosen token but the last agreed with a proposal
            r.out.drafted += len(d)
            r.out.accepted += accepted
            r.out.forward_passes += 1
            accepted_counts.append(accepted)
            keep.append(1 + accepted)  # the pending token and the accepted proposals are now valid cache
            for j, (token, margin, pair) in enumerate(zip(c, m, s)):
                if emit(r, token, margin, pair, tops[i][j] if tops else None):
                    break
        kv.rollback(keep)
        if proposer is not None:
            proposer.commit(accepted_counts, chosen)
    return [r.out for r in rows]


def compaction(rows: int, leaving: list[int]) -> list[int]:
    """The batch rows that stay when the rows `leaving` finish, in their new order: a staying row keeps its
    place unless it sits past the new end, and then fills a leaving row's place. The cache then moves only
    those rows (`KVBatch.select`) instead of copying every staying row; a row's numerics do not depend on its
    place in the batch (each row is its own slice of every product)."""
    gone = set(leaving)
    kept = rows - len(gone)
    order = list(range(kept))
    movers = (j for j in range(kept, rows) if j not in gone)
    for hole in (j for j in range(kept) if j in gone):
        order[hole] = next(movers)
    return order


def _choose(logits: torch.Tensor, drafts: list[list[int]], rows: list[_Row], settings: DecodeSettings,
            dists: list[torch.Tensor | None] | None):
    """Turn verification logits [rows, width, vocab] into the tokens each row emits, with margins and top-2
    (and, when `settings.logprobs` asks, each emitted position's top-k log-probabilities; else None).

    Greedy: position j's token is the argmax; proposals are accepted while they equal it, and the first
    disagreement (or the position after the last proposal) contributes the target's own token. Sampling:
    speculative rejection sampling, so the emitted tokens are distributed exactly as the target's samples.
    """
    top = torch.topk(logits, 2, dim=-1)
    best = logits.argmax(-1)  # argmax, not topk order: ties resolve to the lowest id, as in generate()
    second = torch.where(top.indices[..., 0] == best, top.indices[..., 1], top.indices[..., 0])
    margin = (top.values[..., 0] - top.values[..., 1]).float().double()
    # One copy to the host per step for the whole batch (a GPU syncs once, not once per list). Token ids are
    # exact in float64, and so is a margin computed in the logits' dtype.
    margin_l, best_l, second_l = torch.stack([margin, best.double(), second.double()]).cpu().tolist()
    best_l = [[int(t) for t in row] for row in best_l]
    second_l = [[int(t) for t in row] for row in second_l]
    chosen, margins, pairs = [], [], []
    sampling = settings.temperature > 0
    # The whole step's sampling distributions at once (one softmax, one top-p sort for every row and position):
    # row by row, the top-p sort over the vocabulary cost a third of a sampled decode's time.
    probs = (warp(logits, settings.temperature, settings.top_p, settings.top_k)
             if sampling and settings.sampler is None else None)
    for i, d in enumerate(drafts):
        if sampling:
            q = None if dists is None else dists[i]
            if probs is not None:
                tokens = sample_row(probs[i, : len(d) + 1], d, q, rows[i].generator)
            else:
                tokens = settings.sampler(logits[i, : len(d) + 1], d, q, settings, rows[i].generator)
        else:
            tokens = []
            for j, t in enumerate(d):
                if t != best_l[i][j]:
                    break
                tokens.append(t)
            tokens.append(best_l[i][len(tokens)])
        n = len(tokens)
        chosen.append(tokens)
        margins.append(margin_l[i][:n])
        pairs.append([(best_l[i][j], second_l[i][j]) for j in range(n)])
    return chosen, margins, pairs, _top_logprobs(logits, settings.logprobs, [len(c) for c in chosen])


def _top_logprobs(logits: torch.Tensor, k: int, emitted: list[int]) -> list[list[list[tuple[int, float]]]] | None:
    """Per row, per emitted position: the top-k (token id, log-probability) pairs, log_softmax in float32 (exact
    in the float64 the host list holds). None unless asked (k > 0): plain decoding pays nothing for it."""
    if k <= 0:
        return None
    top = torch.topk(torch.log_softmax(logits.float(), dim=-1), min(k, logits.shape[-1]), dim=-1)
    values, indices = top.values.double().cpu().tolist(), top.indices.cpu().tolist()
    return [[list(zip(indices[i][j], values[i][j])) for j in range(n)] for i, n in enumerate(emitted)]


def sample_tokens(logits: torch.Tensor, drafts: list[int], q: torch.Tensor | None, settings: DecodeSettings,
                  generator: torch.Generator) -> list[int]:
    """A sampled row's emitted tokens: rejection sampling over the target's distributions as the request asks
    for them (temperature, top-k, top-p), against the proposals' `q`."""
    return sample_row(warp(logits, settings.temperature, settings.top_p, settings.top_k), drafts, q, generator)


def sample_row(p: torch.Tensor, drafts: list[int], q: torch.Tensor | None,
               generator: torch.Generator) -> list[int]:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023) for one row, over the target's sampling
    distributions `p` [positions, vocab] (temperature, top-k and top-p applied: `sampling.warp`).

    Accept proposal x with probability min(1, p(x)/q(x)); on rejection sample from norm(max(0, p - q)).
    For n-gram proposals q is a point mass on x, so the residual is p with x removed. If every proposal is
    accepted, the position after them is sampled from p. Without proposals this is plain sampling.
    """
    tokens = []
    for j, x in enumerate(drafts):
        px = float(p[j, x])
        qx = float(q[j, x]) if q is not None else 1.0
        if float(torch.rand((), generator=generator, device=p.device)) * qx < px:
            tokens.append(x)
            continue
        if q is not None:
            residual = (p[j] - q[j]).clamp_min(0)
        else:
            residual = p[j].clone()
            residual[x] = 0
        if float(residual.sum()) <= 0:  # only reachable through rounding: p == q
            residual = p[j]
        tokens.append(draw(residual, generator))
        return tokens
    tokens.append(draw(p[len(drafts)], generator))
    return tokens
