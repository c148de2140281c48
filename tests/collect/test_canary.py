"""The nightly canary of docs/canary.md, end to end on loopback: the real OpenTelemetry SDK exports GenAI spans
through its real OTLP/HTTP exporter to a `toolaudit collect` subprocess; then `replay --collected --sample 2
--per-customer` through two tiny float32 torch paths (the same weights: no drift), `check` at 1.5% (exit 0 on
the point estimate, --rule point; exit 1 on the default upper bound, since 12 calls cannot show an upper bound
under 1.5%),
`report --all-customers` (a report per customer), then `history` and `report --history --all-customers`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import build_tiny_model, torch_path_toml

from .support import REPO, export_with_sdk


def toolaudit(*args: str) -> subprocess.CompletedProcess:
    # one torch thread: on a busy small machine a second OpenMP thread makes the tiny model far slower
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "toolaudit", *args], env=env, capture_output=True, text=True,
                          timeout=180)


@pytest.fixture(scope="module")
def tiny_paths(tmp_path_factory, model_available):
    root = tmp_path_factory.mktemp("canary-model")
    model = build_tiny_model(root / "tiny")
    paths = root / "paths.toml"
    # random weights never end an answer (cut at max_tokens: truncated, not compared): stop strings end them
    stop = ("e", "a", "\n")
    paths.write_text(torch_path_toml("target", model, max_tokens=8, stop=stop)
                     + torch_path_toml("candidate", model, max_tokens=8, stop=stop))
    return paths


def test_the_nightly_canary(receiver, tmp_path, tiny_paths):
    customers = ("acme", "globex", "initech")
    conversations = {f"{c}-conv-{k}": c for c in customers for k in range(3)}
    export_with_sdk(receiver.url, conversations, calls=2, headers={"Authorization": "Bearer sk-prod-secret"})
    db = tmp_path / "canary.duckdb"

    replay = toolaudit("replay", "--collected", str(receiver.folder), "--since", "24h", "--sample", "2",
                       "--per-customer", "--paths", str(tiny_paths), "--baseline", "target", "--candidate",
                       "candidate", "--db", str(db), "--json")
    assert replay.returncode == 0, replay.stderr
    assert "selected 12 calls in 6 sessions of 3 customers" in replay.stderr
    summary = json.loads(replay.stdout)
    assert (summary["calls"], summary["drifted_calls"], summary["error_rows"]) == (12, 0, 0)

    gate = toolaudit("check", "--db", str(db), "--max-call-drift", "1.5%", "--rule", "point")
    assert gate.returncode == 0, gate.stdout + gate.stderr
    strict = toolaudit("check", "--db", str(db), "--max-call-drift", "1.5%")  # the default rule: upper bound
    assert strict.returncode == 1, strict.stdout + strict.stderr
    assert "rule: upper bound of the 95% Wilson interval" in strict.stdout

    report = toolaudit("report", "--db", str(db), "--all-customers", "--write", "json,md", "-o",
                       str(tmp_path / "reports"))
    assert report.returncode == 0, report.stderr
    written = sorted(p.name for p in (tmp_path / "reports").rglob("*.json"))
    assert written == [f"{c}.json" for c in customers]
    for customer in customers:
        data = json.loads(next((tmp_path / "reports").rglob(f"{customer}.json")).read_text())
        assert data["customer"] == customer
    assert not any(b"sk-prod-secret" in p.read_bytes() for p in receiver.folder.iterdir() if p.is_file())

    history = toolaudit("history", "--db", str(db), "--json")  # the first night: one run, its config recorded
    assert history.returncode == 0, history.stderr
    (series,) = json.loads(history.stdout)["series"]
    (night,) = series["rows"]
    assert (series["baseline"], series["candidate"]) == ("target", "candidate")
    assert (night["run_id"], night["calls"], night["drifted_calls"]) == (summary["run_id"], 12, 0)
    assert night["change"] == "first run of this path pair" and night["candidate_tokens_per_s"] > 0
    pages = toolaudit("history", "--html", "--db", str(db), "--all-customers", "-o", str(tmp_path / "reports"))
    assert pages.returncode == 0, pages.stderr
    assert sorted(p.name for p in (tmp_path / "reports" / "history").iterdir()) == [f"{c}.html" for c in customers]
