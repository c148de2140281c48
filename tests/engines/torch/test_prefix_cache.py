"""The prefix cache: exact, found block by block, shared between paths, and still exact when it evicts."""

from __future__ import annotations

import pytest
from helpers import MAX_TOKENS, greedy

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from toolaudit.engines.torch.loop import DecodeSettings, decode  # noqa: E402
from toolaudit.engines.torch.prefix_cache import PrefixCache  # noqa: E402
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
