"""The broken samplers through the whole product, on the real model: the plug-in engine
(tests/plugins/toolaudit-broken-samplers, installed with pip, found through its `toolaudit.engines` entry point)
as candidates of one sampled replay of demo calls, read back by `sampled_summary`. In the suite's time budget
(three calls, 6 samples a side, float32), it must catch the sampler that returns the argmax and not flag the
calibration (the target against itself with other seeds); the correct rejection sampler's row is the tiny-model
test's and the benchmark's (one more path here would cost a third more time). Every sampler's
power is tested where samples are cheap (tests/engines/torch/test_broken_samplers.py, a tiny model); the full
table on demo calls is benchmarks/bench_sampled_power.py (docs/benchmarks.md)."""

from __future__ import annotations

import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from bench_sampled_power import format_table, power_table  # noqa: E402

CALLS, SAMPLES = 3, 6


def test_a_sampled_replay_catches_a_broken_sampler_and_not_the_calibration(tmp_path):
    rows, seconds = power_table(tmp_path, CALLS, SAMPLES, temperature=1.0, top_p=0.95, max_tokens=64,
                                candidates=["argmax-verify"], batch=CALLS * SAMPLES)  # one batch a path
    print(f"\n{CALLS} demo calls, N = {SAMPLES}, temperature 1.0, top_p 0.95, float32; replay {seconds:.0f} s")
    print(format_table(rows))
    by_name = {r.sampler: r for r in rows}
    assert set(by_name) == {"argmax-verify", "calibration (target, other seeds)"}
    assert by_name["argmax-verify"].caught, by_name["argmax-verify"]
    calibration = by_name["calibration (target, other seeds)"]
    assert not calibration.caught and calibration.flagged == 0, calibration
