"""Per-tool figures keyed by the recorded call's tool (`calls.recorded_tool`, migration 12): the first tool call of
the trace's recorded response in a replay, the baseline log's in a compare, never a name a decode path invented;
`summary`, `--json` and the per-customer report key alike."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from conftest import line, tool_call, write_jsonl

from toolaudit.cli import cli
from toolaudit.compare.pairs import recorded_tool
from toolaudit.report import customer_report
from toolaudit.store import Store

# The recorded calls, in trace order: the tool each recorded response called (None: it answered in words).
RECORDED = ["search_tickets", "close_ticket", "search_tickets", None, "search_tickets", "close_ticket"]


def recording(i: int, name: str | None, customer: str) -> dict:
    calls = [tool_call(name, {"query": "q"} if name == "search_tickets" else {"ticket_id": i})] if name else None
    return line(session=f"s{i // 3}", customer=customer, calls=calls, content=None if name else "which ticket?")


def recordings() -> list[dict]:
    """The recorded calls as trace lines: acme's first three, globex's the rest."""
    return [recording(i, name, "acme" if i < 3 else "globex") for i, name in enumerate(RECORDED)]


def trace(path) -> str:
    return str(write_jsonl(path, recordings()))


def keyed(rows: list[dict]) -> dict:
    return {t["tool_name"]: t["calls"] for t in rows}


def test_the_recorded_tool_is_the_first_tool_call_of_the_recorded_message():
    message = {"role": "assistant", "content": None,
               "tool_calls": [tool_call("close_ticket", {"ticket_id": 1}), tool_call("search_tickets", {})]}
    assert recorded_tool(message) == "close_ticket"
    assert recorded_tool({"role": "assistant", "content": "no tool needed"}) is None
    assert recorded_tool(None) is None


def test_a_compare_keys_by_the_baseline_logs_call_on_both_paths_of_the_join(tmp_path):
    """The agreeing pairs (written in SQL) and the differing ones (diffed in Python) alike store the baseline
    log's tool; the candidate's invented name, and the answer in words, are no tool of the recording."""
    base = trace(tmp_path / "base.jsonl")
    # the candidate: the first two calls invent a name, the rest agree; the baseline's words become a call
    cand = recordings()
    for row in cand[:2]:
        row["response"]["choices"][0]["message"]["tool_calls"][0]["function"]["name"] = "2025_q4"
    cand[3] = recording(3, "search_tickets", "globex")
    cand = str(write_jsonl(tmp_path / "cand.jsonl", cand))
    db = str(tmp_path / "c.duckdb")
    made = CliRunner().invoke(cli, ["compare", base, cand, "--db", db])
    assert made.exit_code == 0, made.output
    with Store(db) as store:
        rows = store.query("SELECT call_index, tool_name, recorded_tool, drifted FROM calls ORDER BY session_id, "
                           "call_index")[1]
        assert [r[2] for r in rows] == RECORDED
        assert rows[3][1] == "search_tickets" and rows[3][3]  # the candidate's call: tool_name, never the key
        acme = customer_report(store, None, "acme")
    data = json.loads(CliRunner().invoke(cli, ["summary", "--db", db, "--json"]).output)
    assert data["tool_key"] == "recorded"
    assert keyed(data["tools"]) == {"search_tickets": 3, "close_ticket": 2, None: 1}
    assert acme["tool_key"] == "recorded"
    assert keyed(acme["tools"]) == {"search_tickets": 2, "close_ticket": 1}


@pytest.fixture(scope="module")
def echo(tmp_path_factory):
    from helpers import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("echo"), echo=True)


def test_a_replay_keys_by_the_traces_recorded_calls_whatever_the_decode_path_names(tmp_path, echo):
    """The tiny echo model, its answers prefilled with a call of a tool nobody declared (`2025_q4` on the
    baseline, `sell_304.5` on the candidate): every decoded answer names an invented tool, and the per-tool rows
    of `summary`, `--json`, the report and the floor beside the candidate are still the trace's recorded tools."""
    from helpers import torch_path_toml

    paths = tmp_path / "paths.toml"
    invented = '<tool_call>\n{{"name": "{}", "arguments": {{}}}}\n</tool_call>\n'
    # the echo model repeats the prefill's newline: the stop string ends every answer at once (compared, not cut)
    paths.write_text(torch_path_toml("echo", echo, batch_size=4, max_tokens=4, stop=("\n",),
                                     prefill=invented.format("2025_q4"))
                     + torch_path_toml("echo-spec", echo, batch_size=2, max_tokens=4, stop=("\n",),
                                       prefill=invented.format("sell_304.5")))
    db = str(tmp_path / "r.duckdb")
    result = CliRunner().invoke(cli, ["replay", trace(tmp_path / "t.jsonl"), "--paths", str(paths), "--baseline",
                                      "echo", "--candidate", "echo-spec", "--noise-floor", "--db", db])
    assert result.exit_code == 0, result.output
    with Store(db) as store:
        spec = store.rows("SELECT run_id FROM runs WHERE candidate_name = 'echo-spec'")[0]["run_id"]
        rows = store.query("SELECT tool_name, recorded_tool, match_status, drift_kind FROM calls WHERE run_id = ? "
                           "ORDER BY session_id, call_index", [spec])[1]
        assert [r[1] for r in rows] == RECORDED
        assert {r[0] for r in rows} == {"2025_q4"} and {r[2] for r in rows} == {"matched"}
        assert {r[3] for r in rows} == {"tool_name_changed"}
        globex = customer_report(store, spec, "globex")
    assert globex["tool_key"] == "recorded"
    assert keyed(globex["tools"]) == {"search_tickets": 1, "close_ticket": 1, "(no tool call)": 1}
    # the report's worst examples are named as its tables are: by the recorded call's tool
    assert globex["examples"] and {x["tool_name"] for x in globex["examples"]} == {"2025_q4"}
    assert {x["tool_key"] for x in globex["examples"]} <= {"search_tickets", "close_ticket", "(no tool call)"}
    from toolaudit.report.markdown import render_markdown

    heads = re.findall(r"^### \d+\. `([^`]+)`", render_markdown(globex), re.M)
    assert heads and set(heads) <= {"search_tickets", "close_ticket", "(no tool call)"}, heads
    data = json.loads(CliRunner().invoke(cli, ["summary", "--db", db, "--run", str(spec), "--json"]).output)
    assert data["tool_key"] == "recorded"
    assert keyed(data["tools"]) == {"search_tickets": 3, "close_ticket": 2, None: 1}
    assert keyed(data["noise_floor"]["tools_keyed"]) == {"search_tickets": 3, "close_ticket": 2, None: 1}
    text = CliRunner().invoke(cli, ["summary", "--db", db, "--run", str(spec), "--all"]).output
    assert not any(row.startswith(("2025_q4", "sell_304.5", "(other)")) for row in text.splitlines()), text
    assert any(row.startswith("search_tickets ") for row in text.splitlines()), text
    # the worst example too is named by its recorded call's tool (its detail shows the decoded names)
    worst = re.search(r"^worst example: session \S+ call \d+ \((\w+), ([^)]+)\): tool_name_changed: 2025_q4 -> "
                      r"sell_304\.5", text, re.M)
    assert worst and worst.group(2) in {"search_tickets", "close_ticket"}, text
    assert data["worst_example"]["tool_key"] == worst.group(2)
