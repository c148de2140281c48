"""Batch-invariant kernels (`invariant.py`, the path key `batch_invariant = true`): a row's numbers must not depend
on the other rows of its forward pass, on how many positions its own row computes in it, or on how long the
longest row is. Checked bit for bit in bf16 (where the default kernels are not invariant) on a tiny Llama: the
kernels alone, then whole decodes (batch 3 vs 1, n-gram speculation vs target)."""

from __future__ import annotations

import pytest
from helpers import tiny_llama

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from toolaudit.engines.torch.invariant import (  # noqa: E402
    COLUMN_BLOCK,
    TILE,
    invariant_attention,
    tile_linears,
    tiled,
    use_invariant_attention,
)
from toolaudit.engines.torch.loop import DecodeSettings, decode  # noqa: E402
from toolaudit.engines.torch.proposers import NgramProposer  # noqa: E402
from toolaudit.engines.torch.static_kv import StaticKV  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_tiled_product_gives_a_row_the_same_bits_in_any_batch(dtype):
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 80, generator=g).to(dtype)
    x = torch.randn(3 * TILE + 5, 80, generator=g).to(dtype)
    product = lambda rows: torch.nn.functional.linear(rows, weight)  # noqa: E731
    alone = torch.cat([tiled(x[i:i + 1], product) for i in range(len(x))])
    assert torch.equal(tiled(x, product), alone)
    assert torch.equal(tiled(x[7:30], product), alone[7:30])


def attend(query, key, value, lengths, q_len):
    """invariant_attention for rows whose positions are the last q_len before each row's length."""
    span = key.shape[2]
    positions = torch.tensor(lengths)[:, None] - q_len + torch.arange(q_len)[None]
    mask = (torch.arange(span)[None, None, :] <= positions[:, :, None])[:, None]
    return invariant_attention(torch.nn.Module(), query, key, value, mask)[0]


def test_attention_of_a_query_ignores_its_batch_its_row_width_and_the_span():
    g = torch.Generator().manual_seed(1)
    heads, kv_heads, dim, span = 4, 2, 16, 2 * COLUMN_BLOCK
    key = torch.randn(3, kv_heads, span, dim, generator=g).to(torch.bfloat16)
    value = torch.randn(3, kv_heads, span, dim, generator=g).to(torch.bfloat16)
    query = torch.randn(3, heads, 6, dim, generator=g).to(torch.bfloat16)
    lengths = [300, 40, 511]
    wide = attend(query, key, value, lengths, 6)  # 3 rows, 6 positions each (a verification pass)
    for row, length in enumerate(lengths):
        for j in range(6):  # the same position as a one-token step of that row alone, over one block if it fits
            end = COLUMN_BLOCK if length - 6 + j < COLUMN_BLOCK else span
            one = attend(query[row:row + 1, :, j:j + 1], key[row:row + 1, :, :end], value[row:row + 1, :, :end],
                         [length - 6 + j + 1], 1)
            assert torch.equal(one[0, 0], wide[row, j]), (row, j)


@pytest.fixture(scope="module")
def invariant_model():
    model = tiny_llama(3, float64=False).to(torch.bfloat16)
    use_invariant_attention(model)
    tile_linears(model)
    return model


def invariant_kv(model):
    return lambda rows, columns, width: StaticKV(model, rows, columns, invariant=True)


def test_decodes_are_batch_invariant_and_speculation_exact_in_bf16(invariant_model, prompts):
    many = prompts + [prompts[0][:17], prompts[2][3:]]
    settings = DecodeSettings(max_tokens=30)
    kv = invariant_kv(invariant_model)
    batched = decode(invariant_model, many, settings, batch_size=3, new_kv=kv)
    alone = decode(invariant_model, many, settings, batch_size=1, new_kv=kv)
    spec = decode(invariant_model, many, settings, NgramProposer(3), batch_size=3, new_kv=kv)
    assert sum(o.accepted for o in spec) > 0, "no proposal was accepted: speculation was not exercised"
    for a, b, c in zip(batched, alone, spec):
        assert a.token_ids == b.token_ids == c.token_ids
        assert a.margins == b.margins == c.margins
