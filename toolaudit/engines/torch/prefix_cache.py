"""Prompt KV reused across calls and across decode paths, as vLLM's automatic prefix caching, plus the logits
after each whole prompt (see `PrefixCache`)."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

PREFIX_REUSE = "blocks+longest-prefix"  # how `PrefixCache` finds cached prompt KV (a fingerprint component)


@dataclass
class _Block:
    """One cached block: its KV [layers, 2, kv_heads, tokens, head_dim], its tokens, and its parent's key."""

    kv: torch.Tensor
    tokens: np.ndarray
    parent: bytes


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
        parts, n, last = [], 0, None
        for key, parent, chunk, start in self._chain(tokens):
            block = self._blocks.get(key)
            if block is None:
                shared, best = self._longest_continuation(parent, chunk)
                if shared:  # the logits kept with `last` follow a shorter prompt: not these tokens
                    parts.append(best.kv[:, :, :, :shared])
                    n, last = start + shared, None
                break
            self._blocks.move_to_end(key)
            parts.append(block.kv)
            n, last = start + len(chunk), key
        self.hit_tokens += n
        self.computed_tokens += len(tokens) - n
        logits = self._logits.get(last) if n == len(tokens) and last is not None else None
        return n, (torch.cat(parts, dim=3) if parts else None), logits

    def _longest_continuation(self, parent: bytes, chunk: np.ndarray) -> tuple[int, _Block | None]:
        """The cached block after `parent` sharing the longest first tokens with `chunk` (the oldest of equals),
        and how many it shares."""
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
        return shared, self._blocks[best]

    def insert(self, tokens: list[int], kv: torch.Tensor, logits: torch.Tensor) -> None:
        """Store a whole prompt's KV ([layers, 2, kv_heads, len(tokens), head_dim]) and the logits after it."""
        last = None
        for key, parent, chunk, start in self._chain(tokens):
            if key not in self._blocks:
                block = _Block(kv[:, :, :, start:start + len(chunk)].clone(), chunk, parent)
                self._blocks[key] = block
                self._children.setdefault(parent, {})[key] = None
                self.bytes += block.kv.nbytes
            last = key
        if last is not None and last not in self._logits:
            self._logits[last] = logits.detach().clone()
            self.bytes += self._logits[last].nbytes
        while self.bytes > self.max_bytes and len(self._blocks) > 1:
            self._evict_oldest()

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


def cached_start(cache: PrefixCache | None, prompt: list[int]) -> tuple[int, torch.Tensor | None,
                                                                     torch.Tensor | None]:
    """Where a prompt's prefill starts: (tokens cached, their KV, the logits after the whole prompt or None).
    A prompt cached whole but without the logits after it recomputes its last token (logits need a pass)."""
    n, kv, logits = cache.lookup(prompt) if cache is not None else (0, None, None)
    if logits is None and n and n == len(prompt):
        n, kv = n - 1, kv[:, :, :, : n - 1]
    return n, kv, logits
