"""`BrokenSamplerEngine`: the embedded torch engine with one of the field's broken speculative samplers swapped
in through `DecodeSettings.sampler` (and, for `draft_temperature`, a draft that samples colder). Greedy decoding
is untouched: every bug here is invisible at temperature 0, which is why they shipped."""

from __future__ import annotations

from dataclasses import replace

import torch

from toolaudit.engines.torch.engine import TorchEngine
from toolaudit.engines.torch.loop import sample_row, sample_tokens
from toolaudit.engines.torch.proposers import DraftModelProposer
from toolaudit.engines.torch.sampling import draw, warp

DRAFT_COOLING = 0.5  # draft_temperature: the draft samples at this fraction of the request's temperature


def target_unwarped(logits, drafts, q, settings, generator):
    """vLLM #10198: the target's distribution taken at temperature 1, without top-k or top-p."""
    return sample_row(torch.softmax(logits.float(), dim=-1), drafts, q, generator)


def equality(logits, drafts, q, settings, generator):
    """mlx-swift-lm #459: accept a proposal when it equals one target sample; else draw afresh from the target."""
    p = warp(logits, settings.temperature, settings.top_p, settings.top_k)
    tokens = []
    for j, x in enumerate(drafts):
        if draw(p[j], generator) == x:
            tokens.append(x)
            continue
        tokens.append(draw(p[j], generator))
        return tokens
    tokens.append(draw(p[len(drafts)], generator))
    return tokens


def argmax(logits, drafts, q, settings, generator):
    """mistral.rs #2424: the speculative path verifies greedily: the argmax, whatever the temperature."""
    best = logits.argmax(-1).tolist()
    tokens = []
    for j, x in enumerate(drafts):
        if x != best[j]:
            break
        tokens.append(x)
    tokens.append(best[len(tokens)])
    return tokens


def draft_temperature(logits, drafts, q, settings, generator):
    """DeepSpec #31 / dflash #74: the draft sampled at another temperature than the acceptance ratio assumes. The
    draft's true q (at the cooled temperature) is re-tempered to the request's before the ratio is taken."""
    if q is not None:
        q = q.clamp_min(1e-30) ** DRAFT_COOLING
        q = q / q.sum(-1, keepdim=True)
    return sample_tokens(logits, drafts, q, settings, generator)


SAMPLERS = {"target_unwarped": target_unwarped, "equality": equality, "argmax": argmax,
            "draft_temperature": draft_temperature}


class BrokenSamplerEngine(TorchEngine):
    name = "torch-broken"

    def decode_settings(self, requests):
        settings = super().decode_settings(requests)
        sampler = SAMPLERS.get(self.path.options.get("bug", "none"))
        return settings if sampler is None else replace(settings, sampler=sampler)

    def _proposer(self):
        proposer = super()._proposer()
        if self.path.options.get("bug") == "draft_temperature" and isinstance(proposer, DraftModelProposer):
            proposer.temperature = self.path.temperature * DRAFT_COOLING
        return proposer
