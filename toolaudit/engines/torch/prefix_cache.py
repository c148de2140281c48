"""Prompt KV reused across calls and across decode paths, as vLLM's automatic prefix caching, plus the logits
after each whole prompt (see `PrefixCache`)."""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

PREFIX_REUSE = "blocks+longest-prefix"  # how `PrefixCache` finds cached prompt KV (a fingerprint component)


@dataclass
class _Block:
    """One cached block: its KV [layers, 2, kv_heads, tokens, head_dim], its tokens, its parent's key, and the
    seconds of prefill that computed its tokens (`PathPrefix` charges them to a path that reuses it)."""

    kv: torch.Tensor
    tokens: np.ndarray
    parent: bytes
    seconds: float = 0.0


class PrefixCache:
    """Prompt KV kept between batches and shared by every decode path on the same model.

    Replays are prefill-heavy: a session's calls repeat the previous calls' context, calls of one application
    share a system prompt and tools, and two paths replay the same prompts. As in vLLM's automatic prefix
    caching, KV is stored in blocks keyed by a hash chain over token blocks, so any cached prefix is found by
    walking the chain. Where the chain ends, the longest common prefix with a cached block that continues the
    same chain is reused too, as SGLang's radix cache does: a session's next call starts with the previous
    prompt, whose last block is usually partial (a prompt is rarely a multiple of the block size), and without
    this that block's tokens were prefilled again (~10% of the demo's prefill). A token's KV depends only on
    the tokens before it, so any prefix of a block is valid KV.
    The logits after a prompt are kept with its last block: a second path replaying the same prompt runs no
    prefill at all and starts from bit-identical logits, so only decoding differs.
    What a prompt's KV looks like depends on what was cached before (chunk shapes change float rounding), but
    the replay order is deterministic, so runs repeat. Least recently used blocks go beyond `max_bytes`.
    """

    def __init__(self, block: int = 32, max_bytes: int = 2 << 30):
        self.block, self.max_bytes = block, max_bytes
        self._blocks: OrderedDict[bytes, _Block] = OrderedDict()
        # parent key -> cached blocks that continue it, oldest first (a dict: ties resolve the same in every run)
        self._children: dict[bytes, dict[bytes, None]] = {}
        self._logits: dict[bytes, torch.Tensor] = {}
        self.bytes = 0
        self.hit_tokens = self.computed_tokens = 0

    def _chain(self, tokens: list[int]):
        digest = b""
        for start in range(0, len(tokens), self.block):
            chunk = np.asarray(tokens[start: start + self.block], dtype=np.int64)
            parent, digest = digest, hashlib.blake2b(digest + chunk.tobytes(), digest_size=16).digest()
            yield digest, parent, chunk, start

    def lookup(self, tokens: list[int]) -> tuple[int, torch.Tensor | None, torch.Tensor | None]:
        """(n, kv of tokens[:n] as [layers, 2, kv_heads, n, head_dim], logits after all tokens or None)."""
        return self.find(tokens)[:3]

    def find(self, tokens: list[int]) -> tuple[int, torch.Tensor | None, torch.Tensor | None,
                                               list[tuple[bytes, float, bool]]]:
        """`lookup`, plus the blocks it reused: (key, the prefill seconds of the tokens reused, whole block) each."""
        parts, used, n, last = [], [], 0, None
        for key, parent, chunk, start in self._chain(tokens):
            block = self._blocks.get(key)
            if block is None:
                shared, best = self._longest_continuation(parent, chunk)
                if shared:  # the logits kept with `last` follow a shorter prompt: not these tokens
                    block = self._blocks[best]
                    parts.append(block.kv[:, :, :, :shared])
                    used.append((best, block.seconds * shared / len(block.tokens), shared == len(block.tokens)))
                    n, last = start + shared, None
                break
            self._blocks.move_to_end(key)
            parts.append(block.kv)
            used.append((key, block.seconds, True))
            n, last = start + len(chunk), key
        self.hit_tokens += n
        self.computed_tokens += len(tokens) - n
        logits = self._logits.get(last) if n == len(tokens) and last is not None else None
        return n, (torch.cat(parts, dim=3) if parts else None), logits, used

    def _longest_continuation(self, parent: bytes, chunk: np.ndarray) -> tuple[int, bytes | None]:
        """The key of the cached block after `parent` sharing the longest first tokens with `chunk` (the oldest of
        equals), and how many it shares."""
        shared, best = 0, None
        for key in self._children.get(parent, ()):
            block = self._blocks[key]
            width = min(len(block.tokens), len(chunk))
            differ = np.flatnonzero(block.tokens[:width] != chunk[:width])
            common = int(differ[0]) if len(differ) else width
            if common > shared:
                shared, best = common, key
        if best is None:
            return 0, None
        self._blocks.move_to_end(best)
        return shared, best

    def insert(self, tokens: list[int], kv: torch.Tensor, logits: torch.Tensor, seconds: float = 0.0,
               start: int = 0) -> list[bytes]:
        """Store a whole prompt's KV ([layers, 2, kv_heads, len(tokens), head_dim]) and the logits after it.
        `seconds`: the prefill that computed tokens[start:] (the rest came from this cache), shared out to the
        new blocks by their computed tokens. Returns the keys of the blocks this prompt added."""
        last, added = None, []
        per_token = seconds / max(1, len(tokens) - start)
        for key, parent, chunk, first in self._chain(tokens):
            if key not in self._blocks:
                computed = max(0, first + len(chunk) - max(first, start))
                block = _Block(kv[:, :, :, first:first + len(chunk)].clone(), chunk, parent, per_token * computed)
                self._blocks[key] = block
                self._children.setdefault(parent, {})[key] = None
                self.bytes += block.kv.nbytes
                added.append(key)
            last = key
        if last is not None and last not in self._logits:
            self._logits[last] = logits.detach().clone()
            self.bytes += self._logits[last].nbytes
        while self.bytes > self.max_bytes and len(self._blocks) > 1:
            self._evict_oldest()
        return added

    def _evict_oldest(self) -> None:
        key, block = self._blocks.popitem(last=False)
        self.bytes -= block.kv.nbytes
        siblings = self._children[block.parent]
        siblings.pop(key, None)
        if not siblings:
            del self._children[block.parent]
        dropped = self._logits.pop(key, None)
        if dropped is not None:
            self.bytes -= dropped.nbytes


class PathPrefix:
    """One decode path's use of a `PrefixCache` that other paths share: what it reuses, and the prefill of other
    paths' it reuses (`reused_s`), so that every path is charged its own prompts' prefill once.

    Paths on one model share prompt KV (a second path runs no prefill), which would make the first path pay
    every prompt's prefill and the others none: a speculative path replayed after the target looked twice as
    fast as it is. A block this path computed, or was charged for once, is its own from then on (as its own
    prefix cache would have kept it); a block another path computed is charged at the seconds its prefill took,
    in proportion to the tokens reused. The engine adds `reused_s` to the path's time (`EngineResult`).
    """

    def __init__(self, cache: PrefixCache):
        self.cache = cache
        self._paid: set[bytes] = set()
        self.reused_s = 0.0

    def lookup(self, tokens: list[int]) -> tuple[int, torch.Tensor | None, torch.Tensor | None]:
        n, kv, logits, used = self.cache.find(tokens)
        for key, seconds, whole in used:
            if key not in self._paid:
                self.reused_s += seconds
                if whole:
                    self._paid.add(key)
        return n, kv, logits

    def insert(self, tokens: list[int], kv: torch.Tensor, logits: torch.Tensor, seconds: float = 0.0,
               start: int = 0) -> None:
        self._paid.update(self.cache.insert(tokens, kv, logits, seconds, start))

    def take_reused(self) -> float:
        """The reused prefill seconds since the last call (one engine call's share)."""
        seconds, self.reused_s = self.reused_s, 0.0
        return seconds


def prefill_seconds(since: float, logits: torch.Tensor) -> float:
    """Seconds since `since` (a `time.perf_counter()`) for a prefill whose `logits` are its last output; on a GPU
    after waiting for them (kernels run asynchronously)."""
    if logits.is_cuda:
        torch.cuda.synchronize(logits.device)
    return time.perf_counter() - since


def cached_start(cache: PrefixCache | PathPrefix | None, prompt: list[int]) -> tuple[int, torch.Tensor | None,
                                                                                   torch.Tensor | None]:
    """Where a prompt's prefill starts: (tokens cached, their KV, the logits after the whole prompt or None).
    A prompt cached whole but without the logits after it recomputes its last token (logits need a pass)."""
    n, kv, logits = cache.lookup(prompt) if cache is not None else (0, None, None)
    if logits is None and n and n == len(prompt):
        n, kv = n - 1, kv[:, :, :, : n - 1]
    return n, kv, logits
