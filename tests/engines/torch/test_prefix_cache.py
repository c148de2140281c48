"""The prefix cache: exact, found block by block, shared between paths, and still exact when it evicts."""

from __future__ import annotations

import pytest
from helpers import MAX_TOKENS, greedy

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from toolaudit.engines.torch.loop import DecodeSettings, decode  # noqa: E402
from toolaudit.engines.torch.prefix_cache import PathPrefix, PrefixCache  # noqa: E402
from toolaudit.engines.torch.proposers import NgramProposer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
SETTINGS = DecodeSettings(max_tokens=MAX_TOKENS)


def test_prefix_cache_is_exact_and_shared_between_paths(target, prompts):
    """Prompts sharing prefixes reuse cached blocks; a second path replays them without any prefill."""
    session = [prompts[0][:20], prompts[0][:20] + prompts[1][:9], prompts[0][:20] + prompts[1][:9] + [4, 5, 6]]
    cache = PrefixCache(block=8)
    first = decode(target, session, SETTINGS, prefix_cache=cache, batch_size=2)
    assert [o.token_ids for o in first] == greedy(target, session)
    assert cache.hit_tokens >= 16 + 24  # calls 2 and 3 found earlier calls' full blocks
    computed = cache.computed_tokens
    second = decode(target, session, SETTINGS, NgramProposer(4), prefix_cache=cache, batch_size=3)
    assert [o.token_ids for o in second] == [o.token_ids for o in first]
    assert cache.computed_tokens == computed  # every prompt was found whole, with its logits
    assert second[0].margins[0] == first[0].margins[0]  # bit-identical first logits on both paths
    small = PrefixCache(block=8, max_bytes=1)  # evicts everything but the newest block: still exact
    assert [o.token_ids for o in decode(target, session, SETTINGS, prefix_cache=small)] == greedy(target, session)


def test_a_partially_matching_block_is_reused_token_by_token(target, prompts):
    """A session's next call starts with the previous prompt, whose last block is partial: its tokens are reused
    (radix-style), as is the start of a cached block that a shorter prompt ends inside. Still exact."""
    first, longer = prompts[0][:20], prompts[0][:20] + prompts[1][:9]  # blocks of 8: 20 = 8 + 8 + 4
    cache = PrefixCache(block=8)
    decode(target, [first], SETTINGS, prefix_cache=cache)
    outs = decode(target, [longer], SETTINGS, prefix_cache=cache)
    assert (cache.hit_tokens, cache.computed_tokens) == (20, 20 + 9)  # the 4-token block counted, then 9 new
    inside = prompts[0][:18]  # ends 2 tokens into the cached partial block: 18 found, the last one recomputed
    shorter = decode(target, [inside], SETTINGS, prefix_cache=cache)
    assert cache.hit_tokens == 20 + 18
    assert [o.token_ids for o in outs + shorter] == greedy(target, [longer, inside])
    diverging = prompts[0][:19] + [prompts[0][19] + 1] + prompts[1][:3]  # differs at the partial block's last token
    n, kv, logits = cache.lookup(diverging)
    assert n == 19 and kv.shape[3] == 19 and logits is None
    decode(target, [prompts[0][:16]], SETTINGS, prefix_cache=cache)  # logits cached after the second whole block
    n, _, logits = cache.lookup(prompts[0][:17])  # whole blocks to 16, then 1 token into a cached block
    assert n == 17 and logits is None  # not the logits after the 16-token prompt


def test_each_path_is_charged_its_own_prompts_prefill_once(target, prompts):
    """The path that reuses another path's prompt KV is charged the seconds that prefill took, once per block;
    what a path computed itself, or was charged for already, is free to it (as its own cache would be)."""
    session = [prompts[0][:20], prompts[0][:20] + prompts[1][:9], prompts[0][:20] + prompts[1][:9] + [4, 5, 6]]
    cache = PrefixCache(block=8)
    first, second = PathPrefix(cache), PathPrefix(cache)
    decode(target, session, SETTINGS, prefix_cache=first, batch_size=2)
    assert first.take_reused() == 0.0  # calls 2 and 3 reused call 1's blocks, which this path computed
    computed = sum(block.seconds for block in cache._blocks.values())
    assert computed > 0
    decode(target, session, SETTINGS, NgramProposer(4), prefix_cache=second, batch_size=3)
    assert cache.computed_tokens == 20 + 9 + 3  # the second path ran no prefill...
    assert second.take_reused() == pytest.approx(computed)  # ...and is charged all of it, each block once
    decode(target, session, SETTINGS, prefix_cache=second)
    assert second.take_reused() == 0.0  # already paid
    assert first.take_reused() == 0.0
