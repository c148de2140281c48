"""Prompt KV reused across calls and across decode paths, as vLLM's automatic prefix caching, plus the logits
after each whole prompt (see `PrefixCache`)."""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np
import torch


class PrefixCache:
    """Prompt KV kept between batches and shared by every decode path on the same model.

    Replays are prefill-heavy: a session's calls repeat the previous calls' context, calls of one application
    share a system prompt and tools, and two paths replay the same prompts. As in vLLM's automatic prefix
    caching, KV is stored in blocks keyed by a hash chain over token blocks, so any cached prefix is found by
    walking the chain. The logits after a prompt are kept with its last block: a second path replaying the
    same prompt runs no prefill at all and starts from bit-identical logits, so only decoding differs.
    What a prompt's KV looks like depends on what was cached before (chunk shapes change float rounding), but
    the replay order is deterministic, so runs repeat. Least recently used blocks go beyond `max_bytes`.
    """

    def __init__(self, block: int = 32, max_bytes: int = 2 << 30):
        self.block, self.max_bytes = block, max_bytes
        self._blocks: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self._logits: dict[bytes, torch.Tensor] = {}
        self.bytes = 0
        self.hit_tokens = self.computed_tokens = 0

    def _chain(self, tokens: list[int]):
        digest = b""
        for start in range(0, len(tokens), self.block):
            chunk = np.asarray(tokens[start: start + self.block], dtype=np.int64)
            digest = hashlib.blake2b(digest + chunk.tobytes(), digest_size=16).digest()
            yield digest, start, start + len(chunk)

    def lookup(self, tokens: list[int]) -> tuple[int, torch.Tensor | None, torch.Tensor | None]:
        """(n, kv of tokens[:n] as [layers, 2, kv_heads, n, head_dim], logits after all tokens or None)."""
        parts, n, last = [], 0, None
        for key, _, end in self._chain(tokens):
            kv = self._blocks.get(key)
            if kv is None:
                break
            self._blocks.move_to_end(key)
            parts.append(kv)
            n, last = end, key
        self.hit_tokens += n
        self.computed_tokens += len(tokens) - n
        logits = self._logits.get(last) if n == len(tokens) else None
        return n, (torch.cat(parts, dim=3) if parts else None), logits

    def insert(self, tokens: list[int], kv: torch.Tensor, logits: torch.Tensor) -> None:
        """Store a whole prompt's KV ([layers, 2, kv_heads, len(tokens), head_dim]) and the logits after it."""
        last = None
        for key, start, end in self._chain(tokens):
            if key not in self._blocks:
                block = kv[:, :, :, start:end].clone()
                self._blocks[key] = block
                self.bytes += block.nbytes
            last = key
        if last is not None and last not in self._logits:
            self._logits[last] = logits.detach().clone()
            self.bytes += self._logits[last].nbytes
        while self.bytes > self.max_bytes and len(self._blocks) > 1:
            key, block = self._blocks.popitem(last=False)
            self.bytes -= block.nbytes
            dropped = self._logits.pop(key, None)
            if dropped is not None:
                self.bytes -= dropped.nbytes
