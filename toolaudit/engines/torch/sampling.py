"""The sampling distribution of a row: temperature, then top-k, then top-p (vLLM's and HF's order).

One function for the target and the draft, because speculative sampling is exact only when the acceptance
ratio p(x)/q(x) uses the distributions the tokens are actually drawn from: the target's p with the request's
temperature, top-k and top-p (vLLM #10198 shipped p without them) and the draft's q as it was sampled
(DeepSpec #31 sampled from other logits than the ratio used).
"""

from __future__ import annotations

import torch


def warp(logits: torch.Tensor, temperature: float, top_p: float = 1.0, top_k: int = 0) -> torch.Tensor:
    """Probabilities over the last dimension, in float32: softmax(logits / temperature) restricted to the `top_k`
    most likely tokens and then to the smallest set whose mass reaches `top_p` (the most likely token is always
    kept), renormalised."""
    scaled = logits.float() / temperature
    if top_k and top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # mass strictly above each token
        drop_sorted = before >= top_p  # keep a token while the mass above it is short of top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs
