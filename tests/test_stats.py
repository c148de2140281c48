"""Statistics: Wilson intervals, compounding, expected session drift."""

from __future__ import annotations

import random

import pytest

from toolaudit.analysis.stats import expected_session_drift, wilson


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
    # per-session compounding over per-tool rates is computed in SQL (sessions.compounded_p): test_compare.py


def test_wilson_coverage_small_simulation():
    rng = random.Random(3)
    p, n, trials = 0.01, 2000, 300
    covered = 0
    for _ in range(trials):
        rate = wilson(sum(rng.random() < p for _ in range(n)), n)
        covered += rate.low <= p <= rate.high
    assert covered / trials > 0.9
