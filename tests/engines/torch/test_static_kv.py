"""The static-shape KV cache (`static_kv.StaticKV`): preallocated slots written at positions must give the logits
of a fresh forward pass after rollbacks, rows leaving (compaction) and rows joining, and the decode loop on it
must equal target greedy token for token (float64), in both shape policies: exact (CPU) and fixed (buckets,
padded widths, every column: the shapes CUDA graphs capture). Both attentions run (the `target` fixture)."""

from __future__ import annotations

import pytest
from helpers import greedy, tiny_llama

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from toolaudit.engines.torch.kv import KVBatch  # noqa: E402
from toolaudit.engines.torch.loop import DecodeSettings, decode  # noqa: E402
from toolaudit.engines.torch.prefix_cache import PrefixCache  # noqa: E402
from toolaudit.engines.torch.proposers import DraftModelProposer, NgramProposer  # noqa: E402
from toolaudit.engines.torch.static_kv import StaticKV, bucket  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def fresh(model, seq, width):
    return model(input_ids=torch.tensor([seq])).logits[0, -width:]


@pytest.mark.parametrize("fixed", [False, True], ids=["exact", "fixed"])
def test_rollback_leave_and_join_keep_fresh_logits(target, prompts, fixed):
    a, b, c = prompts[0][:20], prompts[1][:13], prompts[2][:9]
    with torch.inference_mode():
        kv = StaticKV(target, max_rows=3, capacity=40, fixed=fixed, width=4 if fixed else 1)
        kv.admit([a, b])
        kv.mark()
        kv.extend([[7, 8, 9, 10, 11], [12, 13]])  # ragged: row 1 padded
        kv.rollback([2, 1])  # row 0 keeps 7, 8; row 1 keeps 12
        got = kv.extend([[20, 21], [22]])
        assert torch.allclose(got[0, :2], fresh(target, a + [7, 8, 20, 21], 2), rtol=0, atol=1e-10)
        assert torch.allclose(got[1, :1], fresh(target, b + [12, 22], 1), rtol=0, atol=1e-10)
        kv.select([1])  # row 0 leaves: row 1 moves down into slot 0
        assert kv.slot_of == [0]
        kv.admit([c])  # joins into the free slot
        got = kv.extend([[23], [24]])
        assert torch.allclose(got[0, 0], fresh(target, b + [12, 22, 23], 1)[0], rtol=0, atol=1e-10)
        assert torch.allclose(got[1, 0], fresh(target, c + [24], 1)[0], rtol=0, atol=1e-10)


def test_fixed_buffers_keep_an_even_row_stride(target, prompts):
    """The scratch column that capture writes into lies inside the multiple of 256 columns (a 256k+1 stride
    misaligned every row), and growing keeps it so."""
    with torch.inference_mode():
        kv = StaticKV(target, max_rows=2, capacity=255, fixed=True, width=1)
        assert kv.cache.capacity == 256 and kv.cache.keys[0].stride(1) % 256 == 0
        kv.admit([(prompts[0] * 20)[:255]])  # needs 256 columns + the scratch one: grows to 512
        assert kv.cache.capacity == 512


def test_buffers_grow_when_a_row_outgrows_them(target, prompts):
    with torch.inference_mode():
        kv = StaticKV(target, max_rows=1, capacity=8)
        long = (prompts[0] * 8)[:250]
        kv.admit([long])  # the first allocation's 256 columns fill up while decoding
        for token in range(3, 12):
            got = kv.extend([[token]])
        assert kv.cache.capacity == 512
        assert torch.allclose(got[0, 0], fresh(target, long + list(range(3, 12)), 1)[0], rtol=0, atol=1e-10)


def static(model, fixed):
    return lambda rows, columns, width: StaticKV(model, rows, columns, fixed=fixed, width=width)


@pytest.mark.parametrize("fixed", [False, True], ids=["exact", "fixed"])
@pytest.mark.parametrize("kind", ["target", "ngram", "draft"])
def test_decode_on_static_kv_equals_target_greedy(target, prompts, kind, fixed):
    """Continuous batching (2 rows over 5 prompts), speculation with padded verify widths and a draft model on
    its own static cache: the tokens of one-at-a-time greedy decoding, and the margins of the growing cache."""
    many = prompts + [prompts[0][:17], prompts[2][3:]]
    settings = DecodeSettings(max_tokens=40, eos_ids=frozenset({greedy(target, many[:1])[0][9]}))
    draft = tiny_llama(2, base=target, noise=0.3)

    def proposer(new_kv=None):
        return {"target": None, "ngram": NgramProposer(3),
                "draft": DraftModelProposer(draft, 3, new_kv=new_kv)}[kind]

    outs = decode(target, many, settings, proposer(static(draft, fixed)), batch_size=2, new_kv=static(target, fixed))
    assert [o.token_ids for o in outs] == greedy(target, many, settings)
    grown = decode(target, many, settings, proposer(), batch_size=2)
    for a, b in zip(outs, grown):
        assert a.margins == pytest.approx(b.margins, rel=1e-9, abs=1e-9)
        assert (a.drafted, a.accepted, a.forward_passes) == (b.drafted, b.accepted, b.forward_passes)


def test_prefix_cache_serves_static_and_growing_caches_alike(target, prompts):
    """Prompt KV written by one layout is read by the other: the first logits are the cached bits."""
    cache = PrefixCache(block=4)
    with torch.inference_mode():
        first = KVBatch(target).admit([prompts[0]], cache)
        kv = StaticKV(target, 2, 64)
        again = kv.admit([prompts[0], prompts[0][:30] + [5, 6, 7]], cache)
    assert torch.equal(again[0], first[0])
    assert torch.allclose(again[1], fresh(target, prompts[0][:30] + [5, 6, 7], 1)[0], rtol=0, atol=1e-10)


def test_a_reset_cache_serves_the_next_decode_call(target, prompts):
    kv = StaticKV(target, 2, 64, fixed=True)
    settings = DecodeSettings(max_tokens=12)
    reuse = lambda rows, columns, width: kv.reset()  # noqa: E731
    first = decode(target, prompts, settings, batch_size=2, new_kv=reuse)
    second = decode(target, prompts[::-1], settings, batch_size=2, new_kv=reuse)
    assert [o.token_ids for o in second] == [o.token_ids for o in first][::-1]


def test_buckets():
    assert [bucket(n) for n in (1, 2, 3, 5, 9, 100, 1000)] == [1, 2, 4, 8, 16, 128, 512]
