"""Never a silent nothing, call by call: calls without message content or tool definitions are counted and
shown, and a session or customer key that matches nothing is a warning naming the keys the file holds, in
`import`, `compare` and `replay` alike."""

from __future__ import annotations

import json

from click.testing import CliRunner
from conftest import write_jsonl
from format_records import otel_attrs, otlp, span

from toolaudit.cli import cli
from toolaudit.ingest.gaps import CallGaps, gap_warnings, has_content, present_keys


def spans(session_key: str | None = "gen_ai.conversation.id", **overrides) -> list[dict]:
    """Four calls in two sessions (s1, s2) of one customer held in `metadata` as a JSON string."""
    out = []
    for i in range(4):
        attrs = otel_attrs(session=None, customer=None, **overrides)
        attrs["metadata"] = json.dumps({"customer": "acme"})
        if session_key is not None:
            attrs[session_key] = f"s{i // 2 + 1}"
        out.append(otlp(span(f"{i + 1:016x}", attrs, trace_id=f"{i + 1:032x}", start=i + 1, end=i + 2)))
    return out


def run(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_content_and_tools_missing_are_counted_in_import(tmp_path):
    no_content = json.dumps([{"role": "user", "parts": []}])
    path = write_jsonl(tmp_path / "t.jsonl", spans(**{"gen_ai.input.messages": no_content,
                                                      "gen_ai.system_instructions": None,
                                                      "gen_ai.tool.definitions": None}))
    result = run("import", str(path), "-o", str(tmp_path / "out.jsonl"))
    assert result.exit_code == 0, result.output
    assert "4 of 4 calls hold no message content" in result.output
    assert "capture" in result.output
    assert "4 of 4 calls offer no tool definitions" in result.output


def test_a_customer_key_that_matches_nothing_names_the_keys_that_exist(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", spans())
    result = run("import", str(path), "-o", str(tmp_path / "out.jsonl"))
    assert result.exit_code == 0, result.output
    assert "no record carries a customer" in result.output
    assert "metadata.customer" in result.output  # inside the JSON-string attribute
    found = run("import", str(path), "-o", str(tmp_path / "out.jsonl"), "--customer-key", "metadata.customer")
    assert "warning" not in found.output  # no warning once the key is right
    assert all(json.loads(x)["request"]["metadata"]["customer"] == "acme"
               for x in (tmp_path / "out.jsonl").read_text().splitlines())


def test_every_call_its_own_session_is_a_warning_in_compare(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", spans(session_key="conversation"))  # not a key the reader looks at
    b = write_jsonl(tmp_path / "b.jsonl", spans(session_key="conversation"))
    result = run("compare", str(a), str(b), "--db", str(tmp_path / "x.duckdb"))
    assert "every call is its own session (4 calls)" in result.output
    assert "Keys in the file that may hold it: conversation" in result.output
    fixed = run("compare", str(a), str(b), "--db", str(tmp_path / "x.duckdb"), "--session-key", "conversation",
                "--customer-key", "metadata.customer")
    assert fixed.exit_code == 0, fixed.output
    assert "warning" not in fixed.output


def test_gap_counts_in_compare_equal_the_files(tmp_path):
    half = spans(**{"gen_ai.tool.definitions": None})[:2] + spans()[2:]
    a = write_jsonl(tmp_path / "a.jsonl", half)
    result = run("compare", str(a), str(a), "--db", str(tmp_path / "x.duckdb"),
                 "--customer-key", "metadata.customer")
    assert result.output.count("2 of 4 calls offer no tool definitions") == 2  # each side said once
    assert "no message content" not in result.output


def test_has_content_and_present_keys(tmp_path):
    assert not has_content({"messages": [{"role": "user", "content": ""}, {"role": "user", "content": None}]})
    assert has_content({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}]})
    assert has_content({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]})
    path = write_jsonl(tmp_path / "t.jsonl", spans(session_key="session.id"))
    keys = present_keys(path)
    assert "session.id" in keys
    assert "metadata.customer" in keys and "gen_ai.input.messages" not in keys
    gaps = CallGaps()
    for i in range(3):
        gaps.add(f"s{i}", "acme", {"messages": [{"role": "user", "content": "x"}], "tools": [{}]})
    assert [w for w in gap_warnings(gaps, path, None, None) if "own session" in w]
