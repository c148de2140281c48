"""Probe fingerprints through real engines: the embedded engine in process, `toolaudit serve`'s application behind
one base URL through the real openai client, and a replay that records its paths' probes.

What the config fingerprint cannot see, the probe must: a kernel choice of the runtime names no path key, so
config fingerprints stay equal while the probes differ and `fingerprint --probe --expect` and `check
--expect-numerics` (on the stored probe) fail. The tests use one
that exists on every CPU: which kernel runs the prompt's attention (torch's flash kernel or its math kernel,
`torch.backends.cuda.enable_flash_sdp`, which CPU dispatch reads too; their float32 sums differ in the last
bits). A oneDNN setting that computes float32 linears in bf16 (`torch.backends.mkldnn.matmul.fp32_precision`,
or `ONEDNN_DEFAULT_FPMATH_MODE=BF16` for a process) is a second such change, shown where oneDNN can do bf16
math (AVX512 and newer; on an AVX2-only CPU it changes nothing, so that test skips saying so). Models: the tiny random
Llama over SmolLM2's tokenizer (real transformers weights through the real engine, seconds to decode); the
bundled SmolLM2 is probed by scripts/probe_servers.py, figures in docs/benchmarks.md.
"""

from __future__ import annotations

import contextlib
import json
import socket
from dataclasses import replace
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from helpers import DEMO, AppThread, build_tiny_model, get, openai_path_toml, torch_path_toml

from toolaudit.cli import cli
from toolaudit.store import Store

pytestmark = pytest.mark.usefixtures("model_available")
PROMPTS = ["What is the current price of AMZN?", "Cancel order 4411, please.", "Buy 3 shares of MSFT at 410."]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("probe")
    model = build_tiny_model(root / "tiny", head_scale=10.0)  # logprob bits that show a kernel change
    paths = root / "paths.toml"
    paths.write_text(torch_path_toml("tiny", model, batch_size=4) + "threads = 1\n"
                     + torch_path_toml("tiny-spec", model, batch_size=4, speculative=True) + "threads = 1\n"
                     + f'[paths.tiny-hf]\nengine = "hf"\nmodel = "{model}"\ndtype = "float32"\nthreads = 1\n')
    probe_file = root / "probe.jsonl"
    tool = {"type": "function", "function": {"name": "get_quote", "parameters": {"type": "object"}}}
    probe_file.write_text("".join(json.dumps({"messages": [{"role": "user", "content": p}], "tools": [tool],
                                              "max_tokens": 6}) + "\n" for p in PROMPTS))
    return root, model, paths, probe_file


def cli_json(*args: str) -> dict:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def compare_run(root: Path, db: Path) -> None:
    """A run in `db` for `check` to gate (two recorded logs, no engine)."""
    log = root / "log.jsonl"
    log.write_text(DEMO.read_text().splitlines()[0] + "\n")
    result = CliRunner().invoke(cli, ["compare", str(log), str(log), "--db", str(db), "--run-name", "nightly"])
    assert result.exit_code == 0, result.output


@pytest.fixture
def math_attention():
    """The prompt's attention on torch's math kernel instead of its flash kernel: a kernel choice no path key
    names (a process setting), present on every CPU."""
    import torch

    def use(on: bool) -> None:
        torch.backends.cuda.enable_flash_sdp(not on)

    yield use
    use(False)


@pytest.fixture
def fp32_in_bf16():
    """oneDNN float32 matmuls computed in bf16 (torch's process setting). Only where oneDNN has bf16 math:
    elsewhere (AVX2-only CPUs, or ONEDNN_MAX_CPU_ISA=AVX2) oneDNN ignores the setting."""
    import torch

    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("oneDNN has no bf16 math on this CPU (AVX2 only, or ONEDNN_MAX_CPU_ISA below AVX512): "
                    "fp32_precision='bf16' changes nothing here; the attention-kernel tests show the probe")

    def use(on: bool) -> None:
        torch.backends.mkldnn.matmul.fp32_precision = "bf16" if on else "ieee"

    yield use
    use(False)


@pytest.fixture(params=["math_attention", "fp32_in_bf16"])
def kernel_change(request):
    """A runtime kernel change no path key names: one on every CPU, one where oneDNN has bf16 math."""
    return request.getfixturevalue(request.param)


def test_a_kernel_choice_the_config_misses_changes_the_probe(setup, tmp_path, kernel_change):
    root, _, paths, probe_file = setup
    db = tmp_path / "a.duckdb"
    base = ["fingerprint", "--probe", "--path", "tiny", "--paths", str(paths), "--probe-file", str(probe_file),
            "--db", str(db), "--json"]
    first = cli_json(*base, "--against", "latest")  # no earlier probe of the path: nothing to compare yet
    assert first["against"] is None and first["probe_id"] == 1
    assert first["stable"] and first["jitter"] is None and first["numerics"].startswith("num-")
    assert first["prompts"] == 3 and first["repeats"] == 2 and first["seconds"] > 0
    again = cli_json(*base, "--against", "latest")  # a fresh engine on the same path: the same bits
    assert (again["decisions"], again["numerics"]) == (first["decisions"], first["numerics"])
    assert again["against"]["same"] and again["against"]["words"].startswith("identical")

    kernel_change(True)
    changed = cli_json(*base, "--against", "1")
    assert changed["fingerprint"] == first["fingerprint"]  # the config hash does not see it
    assert changed["numerics"] != first["numerics"]
    words = changed["against"]["words"]
    assert ("the runtime's numerics changed, its greedy choices did not" in words
            or "argmax flipped" in words), words
    assert words.endswith("config fingerprint unchanged")

    # the expectation: `fingerprint --probe --expect` probes and judges; `check --expect-numerics` judges the
    # newest stored probe of the path and decodes nothing
    compare_run(root, db)
    expect = [arg for arg in base if arg != "--json"] + ["--expect", first["numerics"]]
    check = ["check", "--run", "nightly", "--db", str(db), "--expect-numerics", first["numerics"], "--path", "tiny"]
    for failed in (CliRunner().invoke(cli, expect), CliRunner().invoke(cli, check)):
        assert failed.exit_code == 1, failed.output
        assert f"expected {first['numerics']}" in failed.output
        assert "numerics changed, decisions identical" in failed.output or "decisions changed" in failed.output
    kernel_change(False)
    passed = CliRunner().invoke(cli, expect)
    assert passed.exit_code == 0 and "as expected" in passed.output, passed.output
    stored = CliRunner().invoke(cli, check)  # the newest stored probe is now the one just taken
    assert stored.exit_code == 0 and "as expected" in stored.output, stored.output


def test_the_hf_engine_probes_from_its_scores(setup, tmp_path):
    """generate()'s scores give the hf engine's logprobs: a stable probe with numerics, the same greedy tokens as
    the embedded engine on the same float32 weights."""
    _, _, paths, probe_file = setup
    args = ["fingerprint", "--probe", "--paths", str(paths), "--probe-file", str(probe_file), "--json"]
    hf, embedded = cli_json(*args, "--path", "tiny-hf"), cli_json(*args, "--path", "tiny")
    assert hf["stable"] and hf["numerics"] and hf["engine"] == "hf" and hf["note"] is None
    assert hf["decisions"] == embedded["decisions"]


def test_probe_usage_errors(setup, tmp_path):
    _, _, paths, probe_file = setup
    runner = CliRunner()
    result = runner.invoke(cli, ["fingerprint", "--path", "tiny", "--paths", str(paths), "--db", "x.duckdb"])
    assert result.exit_code == 2 and "go with --probe" in result.output
    result = runner.invoke(cli, ["fingerprint", "--probe", "--path", "tiny", "--paths", str(paths),
                                 "--against", "1"])
    assert result.exit_code == 2 and "--against needs --db" in result.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user"}], "max_tokens": 999}\n')
    result = runner.invoke(cli, ["fingerprint", "--probe", "--path", "tiny", "--paths", str(paths),
                                 "--probe-file", str(bad)])
    assert result.exit_code == 1 and f"{bad}:1: max_tokens: must be an integer from 1 to 256" in result.output


def test_the_probe_goes_to_toolaudit_db_and_the_gate_needs_a_stored_probe(setup, tmp_path, monkeypatch):
    """`fingerprint --probe` stores its probe in $TOOLAUDIT_DB as every other command reads it; `check
    --expect-numerics` judges stored probes only: with none of the path it cannot check (exit 2) and says how to
    take one, and a too-short hash is refused."""
    root, _, paths, probe_file = setup
    db = tmp_path / "env.duckdb"
    compare_run(root, db)
    runner = CliRunner()
    gate = ["check", "--db", str(db), "--path", "tiny", "--expect-numerics"]
    missing = runner.invoke(cli, [*gate, "num-00000000"])
    assert missing.exit_code == 2 and "no stored probe of path tiny" in missing.output
    assert "fingerprint --probe --path tiny" in missing.output
    monkeypatch.setenv("TOOLAUDIT_DB", str(db))
    probed = runner.invoke(cli, ["fingerprint", "--probe", "--path", "tiny", "--paths", str(paths), "--probe-file",
                                 str(probe_file), "--json"])
    assert probed.exit_code == 0, probed.output
    numerics = json.loads(probed.stdout)["numerics"]
    with Store(db, read_only=True) as store:
        assert [r["numerics"] for r in store.rows("SELECT numerics FROM probes")] == [numerics]
    judged = runner.invoke(cli, [*gate, numerics[:10], "--json"])
    assert judged.exit_code == 0 and json.loads(judged.stdout)["probe"]["ok"] is True, judged.output
    short = runner.invoke(cli, [*gate, numerics[:5]])
    assert short.exit_code == 2 and "prefix of 8+ characters" in short.output


def test_a_replay_records_its_paths_probes(setup, tmp_path, monkeypatch):
    """A run probes each path with the run's small probe (six near-ties of the bundled set, eight tokens, once):
    `--against` the run decodes that same set; `--against latest` compares only probes of one set."""
    from toolaudit.replay.probe_set import RUN_MAX_TOKENS, RUN_PROMPTS, run_probe_set

    _, _, paths, _ = setup
    db = tmp_path / "r.duckdb"
    args = ["replay", str(DEMO), "--limit", "1", "--baseline", "tiny", "--candidate", "tiny-spec", "--paths",
            str(paths), "--db", str(db), "--max-tokens", "4", "--schemas", str(tmp_path)]
    assert CliRunner().invoke(cli, [*args, "--run-name", "quiet", "--no-probe"]).exit_code == 0
    monkeypatch.delenv("TOOLAUDIT_NO_PROBE")
    result = CliRunner().invoke(cli, [*args, "--run-name", "nightly"])
    assert result.exit_code == 0, result.output
    assert "probe 1 of baseline tiny: decisions dec-" in result.output
    assert f"{len(RUN_PROMPTS)} prompts x 1 in" in result.output
    with Store(db) as store:
        runs = {r["name"]: r for r in store.rows("SELECT run_id, name, baseline_fingerprint, "
                                                 "candidate_fingerprint FROM runs")}
        rows = store.rows("SELECT run_id, side, path_name, config_fingerprint, prompts, repeats, probe_set, stable, "
                          "detail->>'source' AS source FROM probes ORDER BY probe_id")
        detail = orjson.loads(store.rows("SELECT detail FROM probes ORDER BY probe_id LIMIT 1")[0]["detail"])
    run, small = runs["nightly"], run_probe_set()
    assert rows == [
        {"run_id": run["run_id"], "side": "baseline", "path_name": "tiny",
         "config_fingerprint": run["baseline_fingerprint"], "prompts": len(RUN_PROMPTS), "repeats": 1,
         "probe_set": small.digest, "stable": True, "source": "bundled:run"},
        {"run_id": run["run_id"], "side": "candidate", "path_name": "tiny-spec",
         "config_fingerprint": run["candidate_fingerprint"], "prompts": len(RUN_PROMPTS), "repeats": 1,
         "probe_set": small.digest, "stable": True, "source": "bundled:run"}]
    assert [len(p["tokens"]) for p in detail["prompts"]] == [RUN_MAX_TOKENS] * len(RUN_PROMPTS)
    # the run's recorded probe, by the run's name: the path probed again, with the run's set, is the same
    again = cli_json("fingerprint", "--probe", "--path", "tiny-spec", "--paths", str(paths), "--db", str(db),
                     "--against", "nightly", "--json")
    assert (again["prompts"], again["repeats"], again["probe_set"]) == (len(RUN_PROMPTS), 2, small.digest)
    assert again["against"]["probe_id"] == 2 and again["against"]["repeats"] == 1
    assert again["against"]["same"], again["against"]
    # latest: the newest probe on the set this probe decodes (the bundled one): none yet, the run's do not count
    latest = CliRunner().invoke(cli, ["fingerprint", "--probe", "--path", "tiny", "--paths", str(paths), "--db",
                                      str(db), "--against", "latest", "--repeats", "1"])
    assert latest.exit_code == 0 and "no earlier probe of path tiny on this probe set" in latest.output
    assert "32 prompts x 1 repeats (bundled set)" in latest.output
    result = CliRunner().invoke(cli, ["fingerprint", "--probe", "--path", "tiny", "--paths", str(paths),
                                      "--db", str(db), "--against", "quiet", "--repeats", "1"])
    assert result.exit_code == 2 and "recorded no probe" in result.output


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(path, port: int):
    """`toolaudit serve`'s application for `path` on loopback `port` (in this process: a server subprocess takes
    20 s to start on this busy machine; tests/serve covers the subprocess)."""
    from toolaudit.serve.app import EngineHost, build_app
    from toolaudit.serve.metrics import Metrics

    host = EngineHost(path, Metrics(path.name))
    app = AppThread(build_app(path, host), on_start=(host.start(),), port=port)
    try:
        app.call(host.ready.wait(), timeout=60)  # the served engine is loaded (the state /health reports)
        status = get(f"http://127.0.0.1:{port}/health")
        assert status[0] == 200, status
        yield
    finally:
        app.close()
        host.close()


def test_server_side_settings_behind_one_url(setup, tmp_path, math_attention):
    """One base URL and model name, served in turn by: the plain path, the same path with its prompt attention
    on the math kernel (a server process setting: neither the client's config nor the server's own
    system_fingerprint names it), the path served in bfloat16 (only the server's system_fingerprint says so), and
    the plain path again (a restart probes alike). `check --expect-numerics` fails against the kernel change."""
    from toolaudit.engines.paths import load_paths

    root, model, _, probe_file = setup
    served_paths = tmp_path / "serve.toml"
    served_paths.write_text(torch_path_toml("served", model, prefix_caching=False) + "threads = 1\n")
    served = load_paths(served_paths)["served"]
    port = free_port()
    paths = tmp_path / "client.toml"
    paths.write_text(openai_path_toml("http", f"http://127.0.0.1:{port}/v1", "served", max_tokens=6))
    db = tmp_path / "s.duckdb"
    probe = ["fingerprint", "--probe", "--path", "http", "--paths", str(paths), "--probe-file", str(probe_file),
             "--db", str(db), "--json"]
    compare_run(root, db)

    with serving(served, port):
        plain = cli_json(*probe)
    assert plain["stable"] and plain["numerics"] and plain["note"] is None
    with serving(served, port):
        math_attention(True)
        kernel = cli_json(*probe, "--against", "probe:1")
        math_attention(False)
    check = CliRunner().invoke(cli, ["check", "--db", str(db), "--expect-numerics", plain["numerics"][:12],
                                     "--path", "http"])  # the newest stored probe of the path: the kernel one
    with serving(replace(served, dtype="bfloat16"), port):
        bf16 = cli_json(*probe, "--against", "probe:1")
    with serving(served, port):
        restarted = cli_json(*probe, "--against", "probe:1")

    assert plain["fingerprint"] == kernel["fingerprint"] == bf16["fingerprint"] == restarted["fingerprint"]
    assert kernel["numerics"] != plain["numerics"] and not kernel["against"]["same"]
    assert bf16["numerics"] != plain["numerics"] and not bf16["against"]["same"]
    assert restarted["against"]["same"], restarted["against"]
    assert check.exit_code == 1 and "expected " + plain["numerics"][:12] in check.output, check.output
    assert "numerics changed, decisions identical" in check.output or "decisions changed" in check.output
    with Store(db) as store:
        seen = [orjson.loads(r["engine_versions"])["system_fingerprint"]
                for r in store.rows("SELECT engine_versions FROM probes ORDER BY probe_id")]
    assert seen[0] == seen[1] == seen[-1] != seen[2]  # the kernel change leaves even the server's own unchanged
