"""The batched KV cache: rollback (holes, crops) and rows leaving keep the logits of a fresh forward pass, under
both attentions (the `target` fixture runs sdpa and the engine's split-cache attention)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from toolaudit.engines.torch.kv import KVBatch  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def test_cache_rollback_matches_a_fresh_forward(target, prompts):
    """After a rejection, the logits that continue equal a fresh forward over the accepted sequence."""
    a, b = prompts[0][:20], prompts[1][:13]
    with torch.inference_mode():
        kv = KVBatch(target)
        kv.admit([a, b])
        kv.mark()
        kv.extend([[7, 8, 9, 10, 11], [12, 13]])
        kv.rollback([2, 1])  # row 0 keeps 7, 8; row 1 keeps 12: holes and a crop
        got = kv.extend([[20, 21], [22]])
        for row, (seq, width) in enumerate([(a + [7, 8, 20, 21], 2), (b + [12, 22], 1)]):
            fresh = target(input_ids=torch.tensor([seq])).logits[0, -width:]
            assert torch.allclose(got[row, :width], fresh, rtol=0, atol=1e-10)
        kv.select([1])  # the longer row leaves: leading padding is trimmed, logits unchanged
        again = kv.extend([[23]])
        fresh = target(input_ids=torch.tensor([b + [12, 22, 23]])).logits[0, -1]
        assert torch.allclose(again[0, 0], fresh, rtol=0, atol=1e-10)
