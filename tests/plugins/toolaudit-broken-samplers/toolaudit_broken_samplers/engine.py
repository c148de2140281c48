"""`BrokenSamplerEngine`: the embedded torch engine with one of the field's broken speculative samplers swapped
in through `DecodeSettings.sampler` (and, for `draft_temperature`, a draft that proposes greedily). Greedy
decoding is untouched: every bug here is invisible at temperature 0, which is why they shipped."""

from __future__ import annotations

from dataclasses import replace

import torch

from toolaudit.engines.torch.engine import TorchEngine
from toolaudit.engines.torch.loop import sample_row
from toolaudit.engines.torch.proposers import DraftModelProposer
from toolaudit.engines.torch.sampling import draw, warp


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


class GreedyDraftProposer(DraftModelProposer):
    """dflash #74 (DeepSpec #31 is the same class of bug: the draft drawn from other logits than the ratio's q):
    the draft proposes its argmax, whatever the temperature, while the acceptance ratio p(x)/q(x) uses q at the
    request's temperature and top-p, as if the proposal had been sampled from it. Over-accepts the draft's
    modes."""

    def pick(self, logits, generators):
        return logits.argmax(-1).tolist(), warp(logits, self.temperature, self.top_p, self.top_k)


SAMPLERS = {"target_unwarped": target_unwarped, "equality": equality, "argmax": argmax}


class BrokenSamplerEngine(TorchEngine):
    name = "torch-broken"

    def __init__(self, path):
        super().__init__(path)
        from toolaudit_broken_samplers import ENGINE

        self.options = ENGINE.read(path.options)  # BrokenOptions: the torch keys and `bug`, typed

    def decode_settings(self, requests):
        settings = super().decode_settings(requests)
        sampler = SAMPLERS.get(self.options.bug)
        return settings if sampler is None else replace(settings, sampler=sampler)

    @property
    def draft_proposer(self):
        return GreedyDraftProposer if self.options.bug == "draft_temperature" else DraftModelProposer
