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
        probs = probs.masked_fill(probs < _nucleus_floor(probs, top_p), 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def _nucleus_floor(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Per distribution, the probability of the last token the nucleus keeps ([..., 1]): tokens are kept in
    descending order while the mass above them is short of `top_p`; a token tied with the last kept one is kept
    too (so the set does not depend on how a sort orders ties).

    Found on the top k tokens, k doubling until their mass reaches top_p everywhere: a full sort of a 49k
    vocabulary per row and position took 180 ms a step on a 2-core CPU, and the nucleus is rarely past the first
    hundred tokens."""
    vocab = probs.shape[-1]
    k = min(64, vocab)
    while True:
        values = torch.topk(probs, k, dim=-1).values  # descending
        before = torch.cumsum(values, dim=-1) - values  # mass strictly above each of the top k
        kept = (before < top_p).sum(dim=-1, keepdim=True)  # >= 1: the first token has nothing above it
        if k == vocab or bool((kept < k).all()):
            return values.gather(-1, kept - 1)
        k = min(2 * k, vocab)


def draw(p: torch.Tensor, generator: torch.Generator) -> int:
    """One token from the (unnormalised, non-negative) distribution `p` [vocab], by inverting its CDF with one
    uniform draw: 20x faster than `torch.multinomial` for one sample of a 49k vocabulary on a CPU (0.1 against
    2.1 ms), which a sampled replay pays per emitted token. A zero-probability token is never drawn."""
    cdf = torch.cumsum(p.double(), dim=0)
    u = torch.rand((), generator=generator, device=p.device, dtype=torch.float64) * cdf[-1]
    return min(int(torch.searchsorted(cdf, u.reshape(1), right=True)), p.shape[0] - 1)
