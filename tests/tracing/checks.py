"""What the per-library tests share: run a recording script in its own interpreter, read a recording the way a
user does (`toolaudit import` with no options), check that it holds the agent sessions, and compare two
recordings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.tracing.agent import CALLS, SESSIONS, TOOLS

REPO = Path(__file__).resolve().parents[2]


def record(script: str, base_url: str, out: Path, *args: str, timeout: float = 60, sent: bool = False) -> Path:
    """`python -m tests.tracing.<script> --base-url URL --out OUT ARGS...` in a fresh interpreter (without
    `--out` when `sent`: the script sends its spans to a receiver that writes OUT)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-m", f"tests.tracing.{script}", "--base-url", base_url,
                           *(() if sent else ("--out", str(out))), *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    assert out.exists() and out.stat().st_size > 0, done.stderr[-3000:]
    return out


def import_calls(path: Path, *options: str) -> tuple[list[dict], str]:
    """(the calls `toolaudit import` writes, its stderr) for a recording, read with `options` only."""
    from click.testing import CliRunner

    from toolaudit.cli import cli

    out = path.with_name(path.stem + ".calls.jsonl")
    result = CliRunner().invoke(cli, ["import", str(path), "-o", str(out), *options])
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in out.read_text().splitlines()], result.output


def assert_agent_calls(calls: list[dict], customers: bool = True) -> None:
    """The 7 calls of the 3 sessions, in order, each with the tool, a recorded tool call, and the earlier turns'
    tool calls and tool answers in its request."""
    assert len(calls) == CALLS
    by_session: dict[str, list[dict]] = {}
    for call in calls:
        by_session.setdefault(call["request"]["metadata"]["session_id"], []).append(call)
    assert {s.session_id: s.turns for s in SESSIONS} == {k: len(v) for k, v in by_session.items()}
    for session in SESSIONS:
        turns = by_session[session.session_id]
        assert [c["request"]["metadata"]["call_index"] for c in turns] == [str(i) for i in range(session.turns)]
        for turn, call in enumerate(turns):
            request, meta = call["request"], call["request"]["metadata"]
            assert meta.get("customer") == (session.customer if customers else None)
            assert request["tools"] == TOOLS
            assert request["messages"][1]["content"] == f"Weather for {session.customer}'s office?"
            assert len(request["messages"]) == 2 + 3 * turn  # + (assistant tool call, tool answer, user) a turn
            answer = call["response"]["choices"][0]["message"]
            assert answer["tool_calls"][0]["function"]["name"] == "get_weather"
            assert json.loads(answer["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris", "limit": 50}
            if turn:
                earlier, tool = request["messages"][-3], request["messages"][-2]
                assert earlier["role"] == "assistant" and earlier["tool_calls"][0]["function"]["name"] == \
                    "get_weather"
                assert tool["role"] == "tool" and tool["tool_call_id"] == earlier["tool_calls"][0]["id"]
                previous = turns[turn - 1]["response"]["choices"][0]["message"]["tool_calls"][0]
                assert earlier["tool_calls"][0]["id"] == previous["id"]  # the answer the session got before


def compare(baseline: Path, candidate: Path, db: Path, **options):
    """compare_logs on two recordings: (counts, the calls table as {(session, index): (customer, status)})."""
    from toolaudit.compare.logs import CompareOptions, compare_logs
    from toolaudit.store import Store

    with Store(db) as store:
        run_id, counts = compare_logs(store, baseline, candidate, CompareOptions(schema_dir=None, **options))
        rows = store.query("SELECT session_id, call_index, customer, match_status FROM calls WHERE run_id = ?",
                           [run_id])[1]
    return counts, {(r[0], r[1]): (r[2], r[3]) for r in rows}
