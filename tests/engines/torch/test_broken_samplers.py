"""The power table on a tiny model: each broken speculative sampler of the field (the plug-in engine's samplers,
tests/plugins/toolaudit-broken-samplers, swapped into the decode loop through `DecodeSettings.sampler` as its
engine does) must be flagged by the sampled-run tests, and neither the correct rejection sampler (n-gram and
draft model) nor the target against itself with other seeds (the calibration) may be. The tiny target's
peaked distributions over a 12-token vocabulary keep each sample three tokens long, so thousands of samples cost
seconds; the same table on the real model and demo calls is benchmarks/bench_sampled_power.py (and, a few
calls of it, tests/analysis/test_sampled_power.py)."""

from __future__ import annotations

import statistics
import sys

import pytest
from conftest import REPO
from helpers import tiny_llama

from toolaudit.compare.distributions import call_test, global_test, shifted
from toolaudit.engines.torch.loop import DecodeSettings, decode
from toolaudit.engines.torch.prefix_cache import PrefixCache
from toolaudit.engines.torch.proposers import DraftModelProposer, NgramProposer

from .test_loop import SAMPLE_VOCAB, peaked  # noqa: F401 (fixture)

sys.path.insert(0, str(REPO / "tests" / "plugins" / "toolaudit-broken-samplers"))
from toolaudit_broken_samplers import engine as broken  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

T, TOP_P, N, CALLS = 1.3, 0.9, 500, 4


def _samples(model, draft, prompt, kind, sampler=None, seed=0):
    settings = DecodeSettings(max_tokens=3, temperature=T, top_p=TOP_P, sampler=sampler,
                              seeds=tuple(seed * 100_000 + i for i in range(N)))
    proposer = None
    if kind == "ngram":
        proposer = NgramProposer(2, 1, 3)
    elif kind.startswith("draft"):
        kind_of = broken.GreedyDraftProposer if kind == "draft-greedy" else DraftModelProposer
        proposer = kind_of(draft, 2, temperature=T, prefix_cache=PrefixCache(), top_p=TOP_P)
    outs = decode(model, [prompt] * N, settings, proposer, prefix_cache=PrefixCache())
    return [" ".join(map(str, o.token_ids)) for o in outs]


def test_power_table_of_the_broken_samplers(peaked):  # noqa: F811
    model, _ = peaked
    # A draft of its own with some spread (not a near copy of the target): a temperature bug in the draft only
    # shows where the draft's proposals are not all but certain.
    draft = tiny_llama(5, vocab=SAMPLE_VOCAB, head_scale=20.0)
    prompts = []
    for start in range(CALLS):  # the target's own greedy continuations: n-grams that predict its next tokens
        head = [1 + start, 2, 3 + start]
        prompts.append(head + decode(model, [head], DecodeSettings(max_tokens=12))[0].token_ids)
    baseline = [_samples(model, draft, p, "target", seed=1) for p in prompts]
    rows = {
        "calibration (target, other seeds)": ("target", None, 2, False),
        "correct, n-gram": ("ngram", None, 3, False),
        "correct, draft model": ("draft", None, 4, False),
        "target without temperature/top-p (vLLM #10198)": ("ngram", broken.target_unwarped, 5, True),
        "equality verification (mlx-swift-lm #459)": ("ngram", broken.equality, 6, True),
        "argmax instead of sampling (mistral.rs #2424)": ("ngram", broken.argmax, 7, True),
        "greedy draft, sampled ratio (dflash #74)": ("draft-greedy", None, 8, True),
    }
    lines = [f"tiny target, vocab {SAMPLE_VOCAB}, 3 tokens, T {T}, top_p {TOP_P}: {CALLS} calls x N {N}",
             f"{'sampler':<50} {'global p':>9} {'flagged':>7} {'median TV':>9}"]
    failures = []
    for name, (kind, sampler, seed, must_flag) in rows.items():
        candidate = [_samples(model, draft, p, kind, sampler, seed) for p in prompts]
        tests = [call_test(b, c, seed=i) for i, (b, c) in enumerate(zip(baseline, candidate))]
        g = global_test(list(zip(baseline, candidate)), seed=0).p_value
        flagged = sum(shifted([t.p_value for t in tests]))
        tv = statistics.median(t.tv for t in tests)
        lines.append(f"{name:<50} {g:>9.4f} {flagged:>7} {tv:>9.3f}")
        if must_flag != (g < 0.01):
            failures.append(name)
    print("\n" + "\n".join(lines))
    assert not failures, f"misjudged: {failures}"


def test_the_plugin_engine_proposes_with_the_greedy_draft_only_for_its_bug():
    """The engine route of the greedy-draft row: `TorchEngine.draft_proposer` is the seam the plug-in names."""
    from toolaudit_broken_samplers import ENGINE

    engine = broken.BrokenSamplerEngine.__new__(broken.BrokenSamplerEngine)
    for bug, kind in (("draft_temperature", broken.GreedyDraftProposer), ("none", DraftModelProposer),
                      ("equality", DraftModelProposer)):
        engine.options = ENGINE.read({"bug": bug})  # the plug-in's typed options, as its engine reads them
        assert engine.draft_proposer is kind, bug
