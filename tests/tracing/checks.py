"""What the per-library tests share: run a recording script in its own interpreter (writing a file, or exporting
live to a `toolaudit collect` subprocess), read a recording the way a user does (`toolaudit import`, the
selection of `replay --collected`, with no options), check that it holds the agent sessions, and compare two
recordings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import CollectProcess
from tests.tracing.agent import CALLS, SESSIONS, TOOLS
from toolaudit.ingest.records import TraceCall

REPO = Path(__file__).resolve().parents[2]


def record(script: str, base_url: str, out: Path | None, *args: str, timeout: float = 120) -> Path | None:
    """`python -m tests.tracing.<script> --base-url URL [--out OUT] ARGS...` in a fresh interpreter (the
    libraries patch `openai` for good); `out` None when the script only exports to a receiver."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-m", f"tests.tracing.{script}", "--base-url", base_url,
                           *(() if out is None else ("--out", str(out))), *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    assert out is None or out.stat().st_size > 0, done.stderr[-3000:]
    return out


def record_live(script: str, base_url: str, root: Path, *args: str, endpoint: str = "--otlp-endpoint") -> Path:
    """Record with the library's real OTLP/HTTP exporter sending to a `toolaudit collect` subprocess (its URL
    after `endpoint`); the folder of collected hourly files. The script flushes and shuts its exporters down
    before it exits, and collect answers 200 only once a request is fsynced: when the script has exited, every
    span and log record is on disk, so nothing is waited for."""
    root.mkdir(parents=True, exist_ok=True)
    collect = CollectProcess(root / "collected", root / "collect.log")
    try:
        record(script, base_url, None, *args, endpoint, collect.url)
    finally:
        assert collect.stop() == 0, (root / "collect.log").read_text()
    return root / "collected"


def import_calls(path: Path, *options: str, out: Path | None = None) -> tuple[list[dict], str]:
    """(the calls `toolaudit import` writes to `out`, beside the recording by default, and its stderr) for a
    recording, read with `options` only."""
    from click.testing import CliRunner

    from toolaudit.cli import cli

    out = out or path.with_name(path.stem + ".calls.jsonl")
    result = CliRunner().invoke(cli, ["import", str(path), "-o", str(out), *options])
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in out.read_text().splitlines()], result.output


def imported(lines: list[dict]) -> list[TraceCall]:
    """`toolaudit import`'s lines as the calls they hold (session, index, customer from request.metadata)."""
    calls = []
    for line in lines:
        meta = line["request"]["metadata"]
        request = {k: v for k, v in line["request"].items() if k != "metadata"}
        calls.append(TraceCall("", 0, meta["session_id"], int(meta["call_index"]), meta.get("customer"), request,
                               line.get("response"), meta.get("source_record")))
    return calls


def selected(folder: Path) -> Path:
    """Every session `toolaudit collect` wrote to `folder`, selected as `replay --collected` selects them (no
    options), into one OTLP/JSON file beside the folder (written once)."""
    from toolaudit.collect.select import Selection, select_collected

    out = folder.parent / "selection.jsonl"
    if not out.exists():
        select_collected(folder, out, Selection())
    return out


def collected_calls(folder: Path) -> tuple[list[TraceCall], str]:
    """(the calls, import's stderr) of what `toolaudit collect` wrote, read with no options as a user reads it:
    `replay --collected`'s selection of every session, imported; and the hourly file itself through `toolaudit
    import`, which must give the same calls (a run that crossed an hour is in two files, and `import` takes one
    trace file: then only the selection is read)."""
    from toolaudit.collect.files import collected_files

    lines, said = import_calls(selected(folder))
    files = collected_files(folder)
    if len(files) == 1:
        direct, _ = import_calls(files[0], out=folder.parent / "hourly.calls.jsonl")
        assert sorted(direct, key=_key) == sorted(lines, key=_key)
    return imported(lines), said


def _key(line: dict) -> tuple:
    meta = line["request"]["metadata"]
    return meta["session_id"], int(meta["call_index"])


def check_sessions(calls: list[TraceCall], tools: bool = True, content: bool = True, customers: bool = True
                   ) -> None:
    """What every library's recording must read back as: the 7 calls of the 3 sessions, by id in turn order,
    with their customers (None when `customers` is False: the library's way of naming them needs an option);
    `tools`: the get_weather definition (False: the library records no tool definitions); with `content`, each
    answer's get_weather call and, in each later turn's request, the earlier answers' calls and their tool
    results (without, no messages and no response)."""
    by_session: dict[str, list[TraceCall]] = {}
    for call in calls:
        by_session.setdefault(call.session_id, []).append(call)
    assert len(calls) == CALLS
    assert {s: len(c) for s, c in by_session.items()} == {s.session_id: s.turns for s in SESSIONS}
    for session in SESSIONS:
        turns = sorted(by_session[session.session_id], key=lambda c: c.call_index)
        assert [c.call_index for c in turns] == list(range(session.turns))
        assert {c.customer for c in turns} == {session.customer if customers else None}
        for turn, call in enumerate(turns):
            assert call.tools == (TOOLS if tools else [])
            if not content:
                assert call.request["messages"] == [] and call.response is None
                continue
            (tool_call,) = call.response_message["tool_calls"]
            assert tool_call["function"]["name"] == "get_weather"
            assert json.loads(tool_call["function"]["arguments"]) == {"city": "Paris", "limit": 50}
            messages = call.request["messages"]
            assert messages[1] == {"role": "user", "content": f"Weather for {session.customer}'s office?"}
            assert len(messages) == 2 + 3 * turn  # + (assistant tool call, tool answer, user) a turn
            earlier = [m for m in messages if m["role"] == "assistant"]
            results = [m for m in messages if m["role"] == "tool"]
            assert len(earlier) == len(results) == turn
            if turn:  # the previous answer's call, and its result, are in this request
                previous = turns[turn - 1].response_message["tool_calls"][0]
                assert earlier[-1]["tool_calls"][0]["id"] == previous["id"] == results[-1]["tool_call_id"]
                assert earlier[-1]["tool_calls"][0]["function"]["name"] == "get_weather"
                assert json.loads(results[-1]["content"]) == {"temp_c": 10 + turn, "city": "Paris"}


def compare(baseline: Path, candidate: Path, db: Path, **options):
    """compare_logs on two recordings: (counts, the calls table as {(session, index): (customer, status)})."""
    from toolaudit.compare.logs import CompareOptions, compare_logs
    from toolaudit.store import Store

    with Store(db) as store:
        run_id, counts = compare_logs(store, baseline, candidate, CompareOptions(schema_dir=None, **options))
        rows = store.query("SELECT session_id, call_index, customer, match_status FROM calls WHERE run_id = ?",
                           [run_id])[1]
    return counts, {(r[0], r[1]): (r[2], r[3]) for r in rows}
