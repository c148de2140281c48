"""The statistics of sampled runs on synthetic outcomes: exact at small N (against scipy's own enumeration of
the splits), deterministic per seed, calibrated (a distribution against itself rejects at <= alpha per call and
not globally), powerful (a TV-0.5 shift at N = 16 is flagged in most calls; the power formula's TV is detected
about 80% of the time), BH as published, paired shares with t intervals."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from toolaudit.compare import distributions as dist


def _draw(rng: np.random.Generator, probs, n: int) -> list[str]:
    return [f"call{i}" for i in rng.choice(len(probs), size=n, p=probs)]


def _g_stat(k: int):
    def g(a, b, axis=-1):
        return dist._g(dist._counts(np.moveaxis(a, axis, -1), k), dist._counts(np.moveaxis(b, axis, -1), k))
    return g


def test_exact_p_values_equal_scipys_enumeration_of_every_split():
    """The table-wise exact p-value is the permutation test's: scipy enumerates all splits at these sizes."""
    rng = np.random.default_rng(11)
    checked = 0
    while checked < 12:
        k, nx, ny = int(rng.integers(2, 5)), int(rng.integers(2, 7)), int(rng.integers(2, 7))
        b, c = _draw(rng, np.ones(k) / k, nx), _draw(rng, rng.dirichlet(np.ones(k)), ny)
        x, y, kk = dist._codes(b, c)
        if kk == 1:
            continue
        ref = stats.permutation_test((x, y), _g_stat(kk), permutation_type="independent", vectorized=True,
                                     n_resamples=math.inf, alternative="greater").pvalue
        assert dist.call_test(b, c, seed=checked).p_value == pytest.approx(ref, rel=1e-9, abs=1e-12)
        checked += 1


def test_tiny_samples_give_fishers_exact_p_and_the_disjoint_tv():
    """3 A against 3 B: 2 of the 20 splits are as extreme, Fisher's exact p (0.1); TV 1 with nothing to vary."""
    t = dist.call_test(["A"] * 3, ["B"] * 3, seed=1)
    assert t.p_value == pytest.approx(stats.fisher_exact([[3, 0], [0, 3]]).pvalue)
    assert (t.tv, t.tv_low, t.tv_high, t.outcomes) == (1.0, 1.0, 1.0, 2)
    assert t.statistic == pytest.approx(stats.chi2_contingency([[3, 0], [0, 3]], lambda_="log-likelihood",
                                                               correction=False).statistic)


def test_degenerate_and_small_calls():
    same = dist.call_test(["f(x=1)"] * 16, ["f(x=1)"] * 16, seed=0)
    assert (same.p_value, same.statistic, same.tv, same.tv_low, same.tv_high) == (1.0, 0.0, 0.0, 0.0, 0.0)
    one = dist.call_test(["a", "b"], ["a"], seed=0)
    assert one.p_value is None and one.tv == pytest.approx(0.5) and one.tv_low is None
    empty = dist.call_test([], ["a", "a"], seed=0)
    assert empty.p_value is None and empty.tv is None and empty.n_baseline == 0
    assert dist.tested(["a", "truncated", "error", "no_tool_call"]) == ["a", "no_tool_call"]


def test_monte_carlo_beyond_the_table_limit_agrees_with_the_exact_value():
    """Forced past its exact path (resamples below the call's table count), the permutation_test p-value is
    within Monte Carlo error of the exact one."""
    rng = np.random.default_rng(4)
    b, c = _draw(rng, np.ones(6) / 6, 16), _draw(rng, [0.4, 0.3, 0.1, 0.1, 0.05, 0.05], 16)
    x, y, k = dist._codes(b, c)
    tables = dist.table_count(np.bincount(x, minlength=k) + np.bincount(y, minlength=k), 16)
    assert tables > 300
    exact = dist.call_test(b, c, seed=0).p_value
    mc = dist.call_test(b, c, seed=0, resamples=tables - 1).p_value
    assert mc != exact and abs(mc - exact) < 4 * math.sqrt(exact * (1 - exact) / tables) + 2 / tables
    assert mc == dist.call_test(b, c, seed=0, resamples=tables - 1).p_value  # deterministic per seed


def test_outcomes_seen_once_are_pooled_exactly():
    """Free text: outcomes seen once add nothing to G wherever they fall. The pooled null gives scipy's p on a
    small call full of them, and a call whose 32 samples all differ has one table and p = 1."""
    b, c = ["a", "a", "a", "b", "c", "d"], ["a", "e", "f", "g", "h", "b"]
    x, y, k = dist._codes(b, c)
    ref = stats.permutation_test((x, y), _g_stat(k), permutation_type="independent", vectorized=True,
                                 n_resamples=math.inf, alternative="greater").pvalue
    assert dist.call_test(b, c, seed=0).p_value == pytest.approx(ref, rel=1e-9)
    assert dist.table_count([3, 2, 1, 1, 1, 1, 1, 1, 1], 6) == dist.table_count([3, 2, 7], 6) == 4 * 3  # pool: rest
    free = dist.call_test([f"b{i}" for i in range(16)], [f"c{i}" for i in range(16)], seed=0)
    assert free.p_value == 1.0 and free.tv == 1.0 and dist.table_count([1] * 32, 16) == 1


def test_deterministic_per_seed():
    rng = np.random.default_rng(2)
    b, c = _draw(rng, [0.5, 0.3, 0.2], 16), _draw(rng, [0.2, 0.3, 0.5], 16)
    assert dist.call_test(b, c, seed=7) == dist.call_test(b, c, seed=7)
    assert dist.call_test(list(reversed(b)), c, seed=7).p_value == dist.call_test(b, c, seed=7).p_value
    calls = [(_draw(rng, [0.6, 0.4], 16), _draw(rng, [0.6, 0.4], 16)) for _ in range(30)]
    assert dist.global_test(calls, seed=3) == dist.global_test(calls, seed=3)


def _calls(rng, n_calls: int, n: int, shift: float = 0.0) -> list[tuple[list[str], list[str]]]:
    """Calls with their own outcome distributions (1 to 6 outcomes); `shift` moves the candidate's mass by a TV of
    `shift` (from the first outcome to a new one)."""
    out = []
    for _ in range(n_calls):
        probs = rng.dirichlet(np.ones(int(rng.integers(1, 7))))
        cand = np.append(probs, 0.0)
        if shift:
            cand = np.append(probs * (1 - shift), shift)
        out.append((_draw(rng, np.append(probs, 0.0), n), _draw(rng, cand, n)))
    return out


def test_calibration_a_distribution_against_itself(capsys):
    """200 calls x N = 16, both sides from the same distribution: per-call rejections at alpha stay near or
    under alpha (binomial(200, 0.05): 10 +- 3), BH flags (almost) nothing, the global test does not reject."""
    rng = np.random.default_rng(2024)
    calls = _calls(rng, 200, 16)
    tests = [dist.call_test(b, c, seed=i) for i, (b, c) in enumerate(calls)]
    p = [t.p_value for t in tests]
    rejected = sum(v <= dist.ALPHA for v in p)
    flagged = sum(dist.shifted(p))
    g = dist.global_test(calls, seed=1)
    with capsys.disabled():
        print(f"\ncalibration  calls  N   rejected at 0.05  BH-flagged  global p\n"
              f"             {len(calls):<5}  16  {rejected:<16}  {flagged:<10}  {g.p_value:.3f}")
    assert rejected <= 200 * dist.ALPHA + 3 * math.sqrt(200 * 0.05 * 0.95)
    assert flagged <= 2
    assert g.calls == 200 and g.p_value > 0.05


def test_power_a_tv_half_shift_at_n16_is_flagged_in_most_calls():
    rng = np.random.default_rng(7)
    calls = [(_draw(rng, [0.75, 0.25], 16), _draw(rng, [0.25, 0.75], 16)) for _ in range(100)]
    tests = [dist.call_test(b, c, seed=i) for i, (b, c) in enumerate(calls)]
    assert sum(dist.shifted([t.p_value for t in tests])) > 60
    assert sum(t.tv_low <= 0.5 <= t.tv_high for t in tests) >= 80  # the TV interval covers the truth (~90%)
    g = dist.global_test(calls, seed=0)
    assert g.p_value == pytest.approx(1 / 2000)  # no permuted sum reaches the observed one


def test_the_power_formula_matches_simulated_rejection_rates(capsys):
    """At the TV `power()` names for N = 16, the exact per-call test rejects about 80% of the time (two
    outcomes at 1/2 +- TV/2: the worst case the formula assumes); at the run TV, the global test over 100 calls
    rejects in most of 12 simulated runs."""
    pw = dist.power(16, 100)
    z = stats.norm.isf(dist.ALPHA / 2) + stats.norm.ppf(0.8)  # 1 df: (z_a/2 + z_b)^2 but for the far tail's mass
    assert pw.per_call_tv == pytest.approx(math.sqrt(z * z / (2 * 16)), rel=1e-4)
    rng = np.random.default_rng(5)
    d = pw.per_call_tv
    rejected = sum(dist.call_test(_draw(rng, [0.5 + d / 2, 0.5 - d / 2], 16),
                                  _draw(rng, [0.5 - d / 2, 0.5 + d / 2], 16), seed=i).p_value <= dist.ALPHA
                   for i in range(200))
    d = pw.run_tv
    runs = [dist.global_test([(_draw(rng, [0.5 + d / 2, 0.5 - d / 2], 16), _draw(rng, [0.5 - d / 2, 0.5 + d / 2], 16))
                              for _ in range(100)], seed=r, resamples=999).p_value for r in range(12)]
    with capsys.disabled():
        print(f"\npower: per call TV {pw.per_call_tv:.3f} rejected {rejected}/200; run TV {pw.run_tv:.3f} over 100 "
              f"calls rejected in {sum(p <= dist.ALPHA for p in runs)}/12 runs")
    assert 0.65 <= rejected / 200 <= 0.95
    assert sum(p <= dist.ALPHA for p in runs) >= 7


def test_power_and_samples_needed_are_inverse_and_monotone():
    for n in (4, 16, 64):
        pw = dist.power(n, 50)
        assert abs(dist.samples_needed(pw.per_call_tv) - n) <= 1
        assert abs(dist.samples_needed(pw.run_tv, calls=50) - n) <= 1
        assert pw.run_tv < pw.per_call_tv
    assert dist.power(16, 500).run_tv < dist.power(16, 50).run_tv
    assert dist.power(1, 1).per_call_tv is None  # even TV 1 is not detected with one sample a side
    with pytest.raises(ValueError):
        dist.samples_needed(0.0)


def test_benjamini_hochberg_as_published():
    """m = 4 tested: q = (0.04, 0.0533, 0.0533, 0.2) by hand; None is not tested."""
    p = [0.01, 0.04, 0.03, 0.2, None]
    q = dist.bh_q_values(p)
    assert q[:4] == pytest.approx([0.04, 0.16 / 3, 0.16 / 3, 0.2]) and q[4] is None
    assert dist.shifted(p) == [True, False, False, False, False]
    assert dist.shifted(p, q=0.06) == [True, True, True, False, False]
    assert dist.shifted([]) == []


def test_paired_share_intervals():
    """d = (0, 0.5, 1): mean 0.5, t(2) half-width 4.303 * 0.5 / sqrt(3), clipped to [-1, 1]."""
    f = dist.paired_share([0.5, 0.5, 0.0], [0.5, 1.0, 1.0])
    assert (f.baseline, f.candidate, f.difference, f.calls) == (pytest.approx(1 / 3), pytest.approx(5 / 6), 0.5, 3)
    assert f.low == pytest.approx(0.5 - stats.t.ppf(0.975, 2) * 0.5 / math.sqrt(3)) and f.high == 1.0
    flat = dist.paired_share([1.0, 0.5, 0.25], [0.9, 0.4, 0.15])
    assert flat.low == flat.high == pytest.approx(-0.1)  # every call dropped 0.1: zero width, not NaN
    assert dist.paired_share([0.2], [0.7]).low == -1.0
    assert dist.paired_share([], []).difference is None


def test_global_tests_share_draws_across_slices():
    """The run's result is `global_test`'s whatever the slices; a slice sums its own calls' G over its own calls
    (a shifted slice rejects, a null one does not)."""
    rng = np.random.default_rng(8)
    calls = _calls(rng, 40, 16) + _calls(rng, 40, 16, shift=0.6)
    groups = [("run", "null" if i < 40 else "shifted") for i in range(80)]
    tests = dist.global_tests(calls, groups, seed=5, resamples=999)
    assert tests["run"] == dist.global_test(calls, seed=5, resamples=999)
    for name, part in (("null", calls[:40]), ("shifted", calls[40:])):
        alone = dist.global_test(part, seed=5, resamples=999)
        assert tests[name].statistic == pytest.approx(alone.statistic) and tests[name].calls == alone.calls == 40
    assert tests["shifted"].p_value == pytest.approx(1 / 1000) and tests["null"].p_value > 0.05
