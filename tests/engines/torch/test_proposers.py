"""Speculative decoding with each proposer (n-gram, random draft, close draft, the target as its own draft) equals
target greedy token for token in float64; a draft must share the target's vocabulary.
"""

from __future__ import annotations

import pytest
from helpers import MAX_TOKENS, greedy, tiny_llama

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from toolaudit import ConfigError  # noqa: E402
from toolaudit.engines.models import check_draft_compatible  # noqa: E402
from toolaudit.engines.torch.loop import DecodeSettings, decode  # noqa: E402
from toolaudit.engines.torch.proposers import DraftModelProposer, NgramProposer, lookup_scan  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
SETTINGS = DecodeSettings(max_tokens=MAX_TOKENS)


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("kind", ["ngram", "draft_random", "draft_close", "draft_self"])
def test_speculative_greedy_equals_target_greedy(target, prompts, kind, k, batch):
    if kind == "ngram":
        proposer = NgramProposer(k, 1, 4)
    elif kind == "draft_random":
        proposer = DraftModelProposer(tiny_llama(1), k)
    elif kind == "draft_close":
        proposer = DraftModelProposer(tiny_llama(2, base=target, noise=0.3), k)
    else:
        proposer = DraftModelProposer(target, k)
    if batch == 1:
        outs = [decode(target, [p], SETTINGS, proposer)[0] for p in prompts]
    else:
        outs = decode(target, prompts, SETTINGS, proposer)
    assert [o.token_ids for o in outs] == greedy(target, prompts)
    drafted = sum(o.drafted for o in outs)
    accepted = sum(o.accepted for o in outs)
    assert drafted > 0
    if kind in ("ngram", "draft_close"):
        assert 0 < accepted < drafted
    if kind == "draft_self":
        assert accepted == drafted  # the target as its own draft never disagrees
        assert all(o.forward_passes < len(o.token_ids) for o in outs)


def test_tokenizer_mismatch_is_a_config_error():
    with pytest.raises(ConfigError, match="draft vocabulary size 301 differs from the target's 300"):
        check_draft_compatible(300, 301)

    class Tok:
        def __init__(self, vocab):
            self.vocab = vocab

        def get_vocab(self):
            return self.vocab

    with pytest.raises(ConfigError, match="tokenizer differs"):
        check_draft_compatible(300, 300, Tok({"a": 0}), Tok({"b": 0}))
    check_draft_compatible(300, 300, Tok({"a": 0}), Tok({"a": 0}))


@pytest.mark.parametrize("n_min, n_max", [(1, 4), (2, 3), (1, 1)])
def test_ngram_index_proposes_what_a_full_scan_does(n_min, n_max):
    """The incremental n-gram index (a step costs what the row gained) against the whole-history scan, on
    histories over a small alphabet (many repeats) growing by accepted runs of 1..6 tokens."""
    import random

    rng = random.Random(n_min * 10 + n_max)
    proposer = NgramProposer(5, n_min, n_max)
    for _ in range(40):
        history = [rng.randrange(6) for _ in range(rng.randrange(0, 20))]
        for _ in range(50):
            k = rng.randrange(0, 7)
            assert proposer.lookup(history, k) == lookup_scan(history, k, n_min, n_max), (history, k)
            history.extend(rng.randrange(6) for _ in range(rng.randrange(1, 7)))
