"""Two deployments exporting to one `toolaudit collect`, told apart by `service.name`, compared call by call:
`compare --collected DIR --baseline-service A --candidate-service B` (with --sample, both sides keep the
sessions drawn from the baseline)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from .support import REPO, chat_attrs, export, send, span


def toolaudit(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "toolaudit", *args], env=env, capture_output=True, text=True,
                          timeout=120)


def test_compare_two_services(receiver, tmp_path):
    start = time.time_ns()
    for service in ("prod", "canary"):
        for s in range(4):
            spans = [span(chat_attrs(f"conv-{s}", f"cust{s % 2}", prompt=f"turn {k} of {s}",
                                     query="drifted" if (service, s, k) == ("canary", 3, 1) else None), start + k)
                     for k in range(2)]
            assert send(receiver.url + "/v1/traces", json.dumps(export(*spans, service=service)).encode())[0] == 200
    db = tmp_path / "cmp.duckdb"
    done = toolaudit("compare", "--collected", str(receiver.folder), "--baseline-service", "prod",
                     "--candidate-service", "canary", "--db", str(db), "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert (summary["baseline"], summary["candidate"], summary["calls"], summary["drifted_calls"]) == (
        "prod", "canary", 8, 1)
    assert summary["unmatched_calls"] == {"baseline_only": 0, "candidate_only": 0}
    assert "selected 8 calls in 4 sessions of 2 customers" in done.stderr
    sampled = toolaudit("compare", "--collected", str(receiver.folder), "--baseline-service", "prod",
                        "--candidate-service", "canary", "--sample", "1", "--per-customer", "--db", str(db),
                        "--json")
    assert sampled.returncode == 0, sampled.stderr
    summary = json.loads(sampled.stdout)
    assert summary["calls"] == 4 and summary["unmatched_calls"] == {"baseline_only": 0, "candidate_only": 0}
    # the selections are kept beside the db, where the run's stored sources point
    assert len(list((tmp_path / "cmp.duckdb.selections").glob("*.jsonl"))) == 4
    wrong = toolaudit("compare", "--collected", str(receiver.folder), "--baseline-service", "prod", "--db",
                      str(db))
    assert wrong.returncode == 2 and "--candidate-service" in wrong.stderr
