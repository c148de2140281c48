"""Sampled replays (temperature > 0, N samples per call) through the real torch engine on the tiny random Llama:
every sample stored once, sample i the draw of its own seed, the call's distribution test beside it, resumable
per call in either schedule. The statistics themselves are tested in tests/analysis/test_distributions.py;
calibration and power on the real model in tests/analysis/test_sampled_power.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from replay.test_replay import _Interrupting, options, paths_file, tiny_model_dir  # noqa: F401 (fixtures)
from toolaudit import ConfigError
from toolaudit.replay.replayer import replay_traces
from toolaudit.store import Store
from toolaudit.store.queries import path_rows

N = 3


def sampled(paths, chunk: int = 4, **kw):
    kw.setdefault("limit", 8)
    return replace(options(paths, temperature=1.0, samples_per_call=N, **kw), chunk=chunk)


def _samples(store, run_id):
    return store.query("""SELECT session_id, call_index, side, sample_index, outcome, text FROM samples
                          WHERE run_id = ? ORDER BY ALL""", [run_id])[1]


def _tests(store, run_id):
    return store.query("""SELECT session_id, call_index, n_baseline, n_candidate, p_value, tv FROM sampled_calls
                          WHERE run_id = ? ORDER BY ALL""", [run_id])[1]


def test_sampled_replay_stores_every_sample_and_a_test_per_call(tmp_path, paths_file):  # noqa: F811
    with Store(tmp_path / "s.duckdb") as store:
        run_id, counts = replay_traces(store, sampled(paths_file))
        assert counts.replayed == 8 and counts.errors == 0
        rows = _samples(store, run_id)
        assert len(rows) == 8 * 2 * N
        assert {r[3] for r in rows} == set(range(N))
        tests = _tests(store, run_id)
        assert len(tests) == 8
        # each call's test is keyed by the recorded call's tool, as the greedy views key theirs (the random model's
        # own samples call none or invent names)
        keys = store.query("""SELECT s.tool_name, c.recorded_tool FROM sampled_calls s JOIN calls c
                              USING (run_id, session_id, call_index) WHERE run_id = ?""", [run_id])[1]
        assert len(keys) == 8 and all(a == b for a, b in keys) and any(a is not None for a, _ in keys)
        # the calls/outputs rows are sample 0's
        texts0 = {(r[0], r[1], r[2]): r[5] for r in rows if r[3] == 0}
        outputs = store.query("SELECT session_id, call_index, side, text FROM outputs WHERE run_id = ?", [run_id])[1]
        assert {(s, c, side): t for s, c, side, t in outputs} == texts0
        # samples of one call are different draws (a random tiny model at temperature 1 spreads widely)
        by_call: dict = {}
        for s, c, side, _i, _, text in rows:
            by_call.setdefault((s, c, side), set()).add(text)
        assert sum(len(v) > 1 for v in by_call.values()) > len(by_call) // 2
        assert store.run_row(run_id)["options"] and '"samples":3' in store.run_row(run_id)["options"].replace(" ", "")
        # what the speed views need to count every sample (tests/analysis/test_sampled.py checks the views on
        # matched calls; the random model's answers are all cut at max_tokens): each call's share of the engine's
        # time, and every sample's tokens and speculative counters, adding up to the engine's own accounting
        engine = {r["side"]: r for r in path_rows(store, run_id)}
        stored = {side: (share, tokens, drafted, accepted, passes) for side, share, tokens, drafted, accepted, passes
                  in store.query("""SELECT side, sum(o.wall_share_s), sum(s.tokens), sum(s.drafted),
                                    sum(s.accepted), sum(s.passes)
                                    FROM outputs o JOIN (SELECT run_id, session_id, call_index, side,
                                        sum(completion_tokens) AS tokens, sum(drafted_tokens) AS drafted,
                                        sum(accepted_tokens) AS accepted, sum(forward_passes) AS passes
                                        FROM samples GROUP BY ALL) s USING (run_id, session_id, call_index, side)
                                    WHERE run_id = ? GROUP BY side""", [run_id])[1]}
        for side, e in engine.items():
            assert stored[side][0] == pytest.approx(e["wall_s"], rel=1e-9)
            assert stored[side][1:] == (e["completion_tokens"], e["drafted_tokens"], e["accepted_tokens"],
                                        round(e["completion_tokens"] / e["tokens_per_forward_pass"]))
        # a rerun draws the same samples: sample i is seeded from (seed, call, i), not from its batch
        again, _ = replay_traces(store, sampled(paths_file, chunk=8))
        assert [r[:5] + (r[5],) for r in _samples(store, again)] == rows
        assert _tests(store, again) == tests


def test_interrupted_sampled_replay_resumes_without_losing_or_doubling_samples(tmp_path, paths_file):  # noqa: F811
    with Store(tmp_path / "full.duckdb") as store:
        full_id, _ = replay_traces(store, sampled(paths_file))
        full = _samples(store, full_id)
    for major in (False, True):
        with Store(tmp_path / f"cut-{major}.duckdb") as store:
            with pytest.raises(KeyboardInterrupt):
                replay_traces(store, sampled(paths_file, path_major=major), engine_factory=_Interrupting(after=2))
            partial = _samples(store, 1)
            assert 0 < len(partial) < len(full) and len(partial) % (2 * N) == 0  # whole calls only
            replay_traces(store, sampled(paths_file, path_major=major), resume=1)
            assert _samples(store, 1) == full
            assert store.query("SELECT count(*) FROM sampled_calls WHERE run_id = 1")[1][0][0] == 8
            assert store.query("SELECT count(*) FROM staged_results")[1][0][0] == 0


def test_samples_need_a_temperature(tmp_path, paths_file):  # noqa: F811
    with Store(tmp_path / "e.duckdb") as store, pytest.raises(ConfigError, match="need temperature > 0"):
        replay_traces(store, options(paths_file, samples_per_call=4))
