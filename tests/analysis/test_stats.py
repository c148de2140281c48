"""Statistics: Wilson intervals, compounding, expected session drift."""

from __future__ import annotations

import random

import pytest

from toolaudit.analysis.stats import expected_session_drift, newcombe, wilson


def test_wilson_known_values():
    rate = wilson(12, 1000)
    assert rate.p == 0.012
    assert rate.low == pytest.approx(0.006879, abs=1e-5) and rate.high == pytest.approx(0.020858, abs=1e-5)
    zero = wilson(0, 200)
    assert zero.low == 0.0 and 0.018 < zero.high < 0.019
    assert wilson(0, 0).high == 1.0


def test_compounding_matches_the_seed_numbers():
    # 1.2% per call -> about 6% per 5-call session
    table = dict(expected_session_drift(0.012))
    assert table[5] == pytest.approx(0.0586, abs=5e-4)
    assert table[1] == pytest.approx(0.012) and len(table) == 10
    # per-session compounding over per-tool rates is computed in SQL (sessions.compounded_p):
    # tests/compare/test_compare.py


def test_wilson_coverage_small_simulation():
    rng = random.Random(3)
    p, n, trials = 0.01, 2000, 300
    covered = 0
    for _ in range(trials):
        rate = wilson(sum(rng.random() < p for _ in range(n)), n)
        covered += rate.low <= p <= rate.high
    assert covered / trials > 0.9


@pytest.mark.parametrize(("new", "old", "low", "high"), [
    ((56, 70), (48, 80), 0.0524, 0.3339),  # Newcombe (1998), Statistics in Medicine 17:873, table II, method 10
    ((9, 10), (3, 10), 0.1705, 0.8090),
    ((6, 7), (2, 7), 0.0582, 0.8062),
    ((5, 56), (0, 29), -0.0381, 0.1926),
    ((0, 10), (0, 20), -0.1611, 0.2775),
    ((0, 10), (0, 10), -0.2775, 0.2775),
    ((10, 10), (0, 20), 0.6791, 1.0),
])
def test_newcombe_interval_matches_the_published_values(new, old, low, high):
    d = newcombe(wilson(*new), wilson(*old))
    assert d.estimate == pytest.approx(new[0] / new[1] - old[0] / old[1])
    assert (d.low, d.high) == (pytest.approx(low, abs=5e-5), pytest.approx(high, abs=5e-5))
    assert d.significant_increase is (low > 0)


def test_newcombe_covers_the_true_difference():
    rng = random.Random(5)
    p_new, p_old, n_new, n_old, trials = 0.03, 0.02, 400, 1500, 300
    covered = 0
    for _ in range(trials):
        k_new = sum(rng.random() < p_new for _ in range(n_new))
        k_old = sum(rng.random() < p_old for _ in range(n_old))
        d = newcombe(wilson(k_new, n_new), wilson(k_old, n_old))
        covered += d.low <= p_new - p_old <= d.high
    assert covered / trials > 0.9
