"""The compiled attention kernel for emulated bf16 (`toolaudit/engines/torch/kernel.py`): the same numerics as
torch's ops up to float32 summation order, a row's output independent of its batch, padding, split and of the
query block it sits in, garbage in masked columns ignored, and torch's ops (with a fingerprint saying so)
wherever the kernel cannot be built."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from toolaudit.engines.torch import kernel, numerics  # noqa: E402
from toolaudit.engines.torch.attention import BASE, grouped_attention  # noqa: E402

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not kernel.available(), reason=f"no attention kernel here: {kernel.unavailable()}")]

BF16 = torch.bfloat16


def rounded(*shape, scale: float = 1.0) -> torch.Tensor:
    return numerics.round_to(torch.randn(*shape) * scale, BF16)


def attend(on: bool, query, keys, values, mask, split: int = 0, scaling: float = 0.125) -> torch.Tensor:
    """grouped_attention as an emulating model's layer runs it, through the kernel (`on`) or torch's ops."""
    module = SimpleNamespace(**{numerics.ROUND_TO: BF16, kernel.KERNEL: on})
    recent_keys, recent_values = keys[:, :, split:].contiguous(), values[:, :, split:].contiguous()
    if split:
        setattr(recent_keys, BASE, (keys[:, :, :split].contiguous(), values[:, :, :split].contiguous()))
    return grouped_attention(module, query, recent_keys, recent_values, mask, scaling=scaling)[0]


def batch(rows: int = 6, q_len: int = 1, columns: int = 200, dim: int = 64, seed: int = 0):
    """Queries, keys and values of `rows` rows left-padded to `columns` (row i has fewer valid columns), the
    boolean mask [rows, 1, q_len, columns] (causal in the last q_len columns) and each row's first valid column."""
    torch.manual_seed(seed)
    query = rounded(rows, 9, q_len, dim, scale=2.0)
    keys, values = rounded(rows, 3, columns, dim, scale=2.0), rounded(rows, 3, columns, dim)
    first = torch.tensor([7 * i for i in range(rows)])
    cols = torch.arange(columns)
    causal = cols[None, :] <= torch.arange(columns - q_len, columns)[:, None]
    mask = ((cols[None, :] >= first[:, None])[:, None, :] & causal[None])[:, None]
    return query, keys, values, mask, first


def test_a_decode_step_matches_torchs_ops_up_to_summation_order():
    """A decode step (1 query, eager numerics): bf16-rounded outputs mostly bit-identical to torch's path; where
    they differ it is by bf16 rounding steps of float32 sums taken in another order, so the kernel is no farther
    from the float64 truth than torch's ops are."""
    query, keys, values, mask, _ = batch(q_len=1)
    ours = attend(True, query, keys, values, mask, split=150)
    theirs = attend(False, query, keys, values, mask, split=150)
    assert ours.shape == theirs.shape
    assert (ours == theirs).float().mean() > 0.99
    truth = attend(False, query.double(), keys.double(), values.double(), mask, split=150)  # no rounding at all
    ulp = truth.abs().clamp_min(2 ** -20) * 2 ** -7
    assert ((ours.double() - truth).abs() / ulp).max() <= 2.5 * ((theirs.double() - truth).abs() / ulp).max() + 1


@pytest.mark.parametrize("q_len", [6, 16])
def test_a_verification_block_has_the_prefill_kernels_numerics(q_len):
    """Several queries per row (a verification pass): flash numerics, those of the emulated prefill
    (`attention._flash_rounded`: unrounded scores, exp rounded before the value product, one division at the
    end), up to float32 summation order."""
    from functools import partial

    from toolaudit.engines.torch.attention import _flash_rounded

    query, keys, values, mask, _ = batch(q_len=q_len, columns=700)
    ours = attend(True, query, keys, values, mask, split=600)
    prefill = _flash_rounded(query, keys, values, mask, 0.125, partial(numerics.round_to, dtype=BF16)).transpose(1, 2)
    assert (ours == prefill).float().mean() > 0.999
    eager = attend(False, query, keys, values, mask, split=600)  # torch's decode-style ops: other numerics
    assert (ours != eager).float().mean() > 0.01


def test_a_rows_output_is_its_own():
    """The kernel reads a row's valid columns only: the same row alone, in a batch of longer and shorter rows,
    with any split between the cache's parts and on one or two threads gives the same bits (torch's batched
    matmuls need not: their blocking follows the batch's shape)."""
    query, keys, values, mask, first = batch(rows=6)
    together = attend(True, query, keys, values, mask, split=120)
    for row in (1, 5):
        start = int(first[row])
        alone = attend(True, query[row:row + 1], keys[row:row + 1, :, start:], values[row:row + 1, :, start:], None)
        assert torch.equal(alone, together[row:row + 1])
    assert torch.equal(attend(True, query, keys, values, mask, split=0), together)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert torch.equal(attend(True, query, keys, values, mask, split=120), together)
    finally:
        torch.set_num_threads(before)


def test_in_eager_numerics_a_query_gets_the_same_bits_in_a_block_as_alone():
    """The kernel's eager numerics computes each query row on its own: a query in a 6-wide block gets the bits of
    a one-query call at its position (the same columns in the same order). The engine runs verification blocks
    in flash numerics instead (serving's prefill kernel); this is what a batch-invariant verification would be."""
    query, keys, values, mask, _ = batch(rows=4, q_len=6, columns=180)
    block = kernel.attention(query, keys, values, None, mask, 0.125)  # [rows, 6, heads, dim]
    for j in (0, 3, 5):
        end = 180 - 5 + j  # position j sees the columns up to its own
        step = kernel.attention(query[:, :, j:j + 1], keys[:, :, :end], values[:, :, :end], None,
                                mask[:, :, j:j + 1, :end], 0.125)
        assert torch.equal(step[:, 0], block[:, j])


def test_masked_columns_are_never_read():
    """Padding may hold anything (here NaN and huge values): a masked column adds nothing, not even NaN * 0."""
    query, keys, values, mask, _ = batch(rows=3)
    clean = attend(True, query, keys, values, mask)
    keys, values = keys.clone(), values.clone()
    hidden = ~mask[:, 0, 0]  # [rows, columns]
    keys.permute(0, 2, 1, 3)[hidden] = float("nan")
    values.permute(0, 2, 1, 3)[hidden] = 1e30
    assert torch.equal(attend(True, query, keys, values, mask), clean)


@pytest.mark.parametrize("dim,scaling", [(16, 0.25), (8, 8 ** -0.5)])
def test_small_heads_and_a_scale_that_is_not_a_power_of_two(dim, scaling):
    """Tiny test models have 8- and 16-wide heads; 1/sqrt(8) is not a power of two, so the scores are scaled in
    float32 after the product, as torch's paths do: a decode step against torch's ops, a 3-query block against
    the emulated prefill's flash numerics."""
    from functools import partial

    from toolaudit.engines.torch.attention import _flash_rounded

    query, keys, values, mask, _ = batch(dim=dim, q_len=1)
    ours = attend(True, query, keys, values, mask, split=90, scaling=scaling)
    theirs = attend(False, query, keys, values, mask, split=90, scaling=scaling)
    assert (ours == theirs).float().mean() > 0.99
    query, keys, values, mask, _ = batch(dim=dim, q_len=3)
    ours = attend(True, query, keys, values, mask, split=90, scaling=scaling)
    prefill = _flash_rounded(query, keys, values, mask, scaling, partial(numerics.round_to, dtype=BF16))
    assert (ours == prefill.transpose(1, 2)).float().mean() > 0.99


def test_without_a_compiler_torchs_ops_run_and_the_fingerprint_says_so(tmp_path):
    """No compiler and nothing cached (a fresh cache directory): the kernel is unavailable with the reason, an
    emulated bf16 path's fingerprint names no kernel, and decoding still works on torch's ops."""
    code = (
        "from toolaudit.engines.torch import kernel; "
        "print(kernel.available(), kernel.kernel_name('emulated', 'bfloat16', 'cpu', False), '|', kernel.unavailable())"
    )
    env = dict(os.environ, CC=str(tmp_path / "no-such-cc"), XDG_CACHE_HOME=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split("|")[0].split() == ["False", "None"]
    assert "no C compiler" in out.stdout
    env = dict(os.environ, TOOLAUDIT_ATTENTION_KERNEL="torch")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert "TOOLAUDIT_ATTENTION_KERNEL=torch" in out.stdout and out.stdout.startswith("False None")
    assert kernel.kernel_name("emulated", "bfloat16", "cpu", False) == kernel.NAME
    assert kernel.kernel_name("native", "bfloat16", "cpu", False) is None
    assert kernel.kernel_name("emulated", "bfloat16", "cpu", True) is None  # the invariant layout's own attention
