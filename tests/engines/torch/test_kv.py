"""The batched KV cache: rollback (holes, crops) and rows leaving keep the logits of a fresh forward pass, under
both attentions (the `target` fixture runs sdpa and the engine's split-cache attention)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from toolaudit.engines.torch.kv import KVBatch, _full  # noqa: E402

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


def test_ragged_pass_skips_the_lm_head_on_padding(target, prompts):
    """Rows with fewer tokens than the widest are padded; padding gets zero logits, real positions the model's."""
    a, b = prompts[0][:9], prompts[1][:11]
    with torch.inference_mode():
        kv = KVBatch(target)
        kv.admit([a, b])
        logits = kv.extend([[5, 6, 7], [8]])
        assert torch.count_nonzero(logits[1, 1:]) == 0
        fresh = target(input_ids=torch.tensor([b + [8]])).logits[0, -1]
        assert torch.allclose(logits[1, 0], fresh, rtol=0, atol=1e-10)
        fresh = target(input_ids=torch.tensor([a + [5, 6, 7]])).logits[0, -3:]
        assert torch.allclose(logits[0], fresh, rtol=0, atol=1e-10)


def test_row_kv_of_a_dense_row_equals_its_whole_cache(target, prompts):
    """A dense row's KV, written part by part from a split cache (base + recent), equals its joined layers;
    a left-padded row's KV holds only its valid columns."""
    with torch.inference_mode():
        kv = KVBatch(target)
        kv.admit([prompts[0][:12]])
        kv.mark()
        kv.extend([[3, 4]])
        kv.rollback([2])
        got = kv.row_kv(0)
        want = torch.stack([torch.stack([k[0], v[0]]) for k, v in map(_full, kv.cache.layers)])
        assert got.shape[3] == 14 and torch.equal(got, want)
        ragged = KVBatch(target)
        ragged.admit([prompts[0][:12], prompts[0][:5]])  # row 1 is left-padded: the gather path
        short = KVBatch(target)
        short.admit([prompts[0][:5]])
        assert torch.equal(ragged.row_kv(1), short.row_kv(0))


@pytest.mark.parametrize("length", [3, 6, 16])
def test_a_row_admitted_into_a_finished_slot_continues_like_a_fresh_forward(target, prompts, length):
    """Continuous batching writes a new prompt's KV into a finished row's slot of a split cache (base columns plus
    recent ones): 3 tokens fit in the recent columns, 6 span both parts, 16 widen the cache first; the new row
    and its neighbour then continue with a fresh forward pass's logits."""
    a, b, c = prompts[0][:10], prompts[1][:9], prompts[2][:length]
    with torch.inference_mode():
        kv = KVBatch(target)
        kv.admit([a, b])
        for token in (4, 5, 6, 7):  # recent columns after the prompts' base
            kv.extend([[token], [token]])
        kv.admit([c], slots=[0])
        got = kv.extend([[30], [31]])
        for row, seq in enumerate([c + [30], b + [4, 5, 6, 7, 31]]):
            fresh = target(input_ids=torch.tensor([seq])).logits[0, -1]
            assert torch.allclose(got[row, 0], fresh, rtol=0, atol=1e-10)


def test_rows_leaving_in_compaction_order_move_only_the_rows_past_the_end(target, prompts, monkeypatch):
    """Rows 0 and 2 of five finish: `loop.compaction` keeps row 1 where it is and moves rows 3 and 4 (past the new
    end) into the places of rows 0 and 2, and the cache copies only those two rows. The result equals gathering
    every kept row (the old way), bit for bit: the same columns (leading padding trimmed, base and recent parts
    folded) and the same next logits."""
    from toolaudit.engines.torch import kv as kv_module
    from toolaudit.engines.torch.loop import compaction

    order = compaction(5, [0, 2])
    assert order == [3, 1, 4]
    assert kv_module.compaction_moves(order) == ([0, 2], [3, 4])
    assert kv_module.compaction_moves([1, 0, 2]) is None  # any other order gathers

    seqs = [prompts[0][:14], prompts[1][:9], prompts[2][:11], prompts[1][:6], prompts[0][:8]]

    def batch():
        kv = KVBatch(target)
        kv.admit(seqs)
        for token in (4, 5, 6):  # recent columns after the prompts' base
            kv.extend([[token]] * len(seqs))
        return kv

    with torch.inference_mode():
        moved = batch()
        moved.select(order)
        monkeypatch.setattr(kv_module, "compaction_moves", lambda rows: None)
        gathered = batch()
        gathered.select(order)
        assert moved.columns == gathered.columns < batch().columns  # the longest row left: padding trimmed
        assert torch.equal(moved.valid, gathered.valid) and torch.equal(moved.lengths, gathered.lengths)
        for mine, theirs in zip(moved.cache.layers, gathered.cache.layers):
            assert all(torch.equal(x, y) for x, y in zip(_full(mine), _full(theirs)))
        got = moved.extend([[7]] * 3)
        assert torch.equal(got, gathered.extend([[7]] * 3))
        fresh = target(input_ids=torch.tensor([seqs[4] + [4, 5, 6, 7]])).logits[0, -1]  # row 4, now in row 2
        assert torch.allclose(got[2, 0], fresh, rtol=0, atol=1e-10)
