"""Tool calls with free-text arguments: every signature differs, yet a shift in one argument's values (a limit of
50 turning into 500) must be seen, and a distribution against itself must still reject at <= alpha."""

from __future__ import annotations

import numpy as np

from toolaudit.compare.distributions import call_test, global_test
from toolaudit.compare.projections import Projections


def _samples(rng, n, p50):
    """search_tickets with a unique free-text query and a limit of 50 (probability p50) or 500."""
    return [f'search_tickets{{"limit":{50 if rng.random() < p50 else 500},"query":"{rng.integers(1 << 40):x}"}}'
            for _ in range(n)]


def test_projections_read_the_tool_and_each_argument():
    p = Projections(['t{"a":1,"b":"x"}', 't{"a":2}', "no_tool_call"], ['u{"c":true}', "unparseable"])
    assert p.projections == 2 + 2 + 1  # label, tool, t.a, t.b, u.c
    assert p.useful
    assert not Projections(["no_tool_call", "unparseable"], ["no_tool_call", "no_tool_call"]).useful


def test_an_argument_shift_under_unique_signatures_is_detected_and_the_null_is_calibrated():
    rng = np.random.default_rng(7)
    null = [call_test(_samples(rng, 16, 0.5), _samples(rng, 16, 0.5), seed=i).p_value for i in range(60)]
    shifted = [call_test(_samples(rng, 16, 0.5), _samples(rng, 16, 0.95), seed=i).p_value for i in range(30)]
    null_rate, power = np.mean(np.array(null) < 0.05), np.mean(np.array(shifted) < 0.05)
    print(f"\nunique signatures, limit 50 at 0.5 vs 0.95, N 16: rejected {power:.2f}; null rejected {null_rate:.2f}")
    assert null_rate <= 0.12  # alpha 0.05 plus the slack of 60 draws
    assert power >= 0.6
    assert global_test([(_samples(rng, 16, 0.5), _samples(rng, 16, 0.7)) for _ in range(40)], 3).p_value < 0.01
    assert global_test([(_samples(rng, 16, 0.5), _samples(rng, 16, 0.5)) for _ in range(40)], 3).p_value > 0.01


def test_small_samples_are_tested_over_every_split():
    b, c = ['t{"a":1,"q":"x"}', 't{"a":1,"q":"y"}'], ['t{"a":2,"q":"z"}', 't{"a":2,"q":"w"}']
    test = call_test(b, c, seed=0)
    assert test.p_value == 2 / 6  # the observed split and its mirror are the most extreme of C(4, 2) = 6
