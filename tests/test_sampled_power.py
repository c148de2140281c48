"""Calibration and power of sampled replays, on the real model: the target against itself with other seeds must
not be flagged, and neither must the correct rejection sampler; each broken sampler of the field, shipped as a
plug-in engine (tests/plugins/toolaudit-broken-samplers, installed with pip, found through its entry point),
must be (global p < 0.01). The table prints; benchmarks/bench_sampled_power.py runs it on more calls
(docs/benchmarks.md has that table).

Few calls keep this in the suite's budget: the first call of CALLS demo sessions, N samples per path, float32
(fast on every CPU), a hot temperature so the target's answers spread."""

from __future__ import annotations

import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from bench_sampled_power import format_table, power_table  # noqa: E402

CALLS, SAMPLES = 4, 12


def test_broken_samplers_are_caught_and_the_correct_ones_and_the_calibration_are_not(tmp_path):
    rows, seconds = power_table(tmp_path, CALLS, SAMPLES, temperature=1.0, top_p=0.95, max_tokens=64)
    print(f"\n{CALLS} demo calls, N = {SAMPLES}, temperature 1.0, top_p 0.95, float32; replay {seconds:.0f} s")
    print(format_table(rows))
    assert len(rows) == 7
    for row in rows:
        assert row.calls >= CALLS - 1, row  # a call whose samples were all cut or failed is untested, not dropped
        if row.must_flag:
            assert row.caught, f"{row.sampler} not caught: global p {row.global_p}"
        else:
            assert not row.caught and row.flagged == 0, f"{row.sampler} flagged: {row}"
