"""The demo's choices (`replay/demo.py`, traces/demo.paths.toml): the paths a newcomer's first replay decodes,
checked without decoding (the demo itself takes minutes: its time and output are benchmarks, docs/benchmarks.md)."""

from __future__ import annotations

from dataclasses import replace

from toolaudit.engines.paths import builtin_paths
from toolaudit.replay.demo import DEMO_CALLS, DemoChoice, demo_options
from toolaudit.replay.inputs import noise_floor_path, resolve_paths


def test_the_demo_decodes_the_built_in_paths_at_32_rows_and_its_floor_at_64():
    options = demo_options(DemoChoice())
    baseline, (candidate, floor) = resolve_paths(options)
    builtin = builtin_paths()
    # the built-in paths but for the rows decoding together and the token limit: same model, dtype, speculation
    for path in (baseline, candidate):
        assert (path.batch_size, path.max_tokens) == (32, 64)
        assert replace(path, batch_size=16, max_tokens=96, options={}) == builtin[path.name]
        assert path.options == {"numerics": "auto"}  # `--numerics`, the demo's run-wide override
    assert options.limit == DEMO_CALLS == options.chunk and options.calls_per_session == 2 and options.noise_floor
    assert floor == noise_floor_path(baseline, min(options.chunk, options.limit))
    assert floor.batch_size == 64 and replace(floor, name="target", batch_size=32) == baseline


def test_the_sampled_demo_shares_the_paths_and_the_matrix_keeps_the_built_in_remedies():
    sampled = demo_options(DemoChoice(sampled=True))
    baseline, (candidate, _calibration) = resolve_paths(sampled)
    assert baseline.batch_size == candidate.batch_size == 32 and baseline.temperature > 0 and baseline.samples > 1
    assert baseline.max_tokens == candidate.max_tokens == 96  # sampled answers run longer: fewer cut at 96
    assert resolve_paths(demo_options(DemoChoice(sampled=True, max_tokens=40)))[0].max_tokens == 40
    matrix = demo_options(DemoChoice(matrix=True))
    first, rest = resolve_paths(matrix)
    paths = [first, *rest]
    builtin = builtin_paths()
    assert all(replace(p, max_tokens=96, options=builtin[p.name].options) == builtin[p.name] for p in paths)
    assert {p.max_tokens for p in paths} == {64}
