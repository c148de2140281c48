"""OpenTelemetry's official `opentelemetry-instrumentation-openai-v2` (2.4b0, with opentelemetry-util-genai): the real
openai client, instrumented by the real library, calls a served model; the spans (and log records) are written as a
collector writes them, or sent live by the real OTLP/HTTP exporters (spans to `/v1/traces`, log records to
`/v1/logs`) to a `toolaudit collect` subprocess, and read back with no options. The session is
`gen_ai.conversation.id` on the parent agent span only (ended, and exported, after the calls inside it), or in event
mode `session.id` copied from baggage onto each call's span (each call its own trace); the customer `user.id` copied
from baggage."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tests.tracing.agent import CALLS
from tests.tracing.checks import check_sessions, collected_calls, record, record_live
from toolaudit.cli import cli
from toolaudit.compare.logs import CompareOptions, compare_logs
from toolaudit.ingest.traces import TraceCall, read_trace
from toolaudit.store import Store


def v2(served, out, mode: str, *options: str):
    return record("record", served, out, "otel-v2", mode, *options)


def _calls(path, **kw) -> list[TraceCall]:
    items = list(read_trace(path, require_response=False, **kw))
    assert [i for i in items if not isinstance(i, TraceCall)] == []
    return items


def test_span_attribute_mode_reads_every_call_session_and_customer(served, tmp_path):
    path = v2(served, tmp_path / "spans.jsonl", "span")
    check_sessions(_calls(path), tools=False)  # the library records no gen_ai.tool.definitions


@pytest.mark.parametrize("mode", ["span", "event"])
def test_live_export_to_toolaudit_collect_reads_with_no_options(served, tmp_path, mode):
    folder = record_live("record", served, tmp_path, "otel-v2", mode)
    kinds = {next(iter(json.loads(line))) for p in folder.glob("traces-*.jsonl") for line in p.open()}
    assert kinds == ({"resourceSpans", "resourceLogs"} if mode == "event" else {"resourceSpans"})
    calls, said = collected_calls(folder)
    assert "(otel, detected)" in said and "0 error records" in said
    check_sessions(calls, tools=False)


def test_span_attribute_mode_imports_with_no_options(served, tmp_path):
    path = v2(served, tmp_path / "spans.jsonl", "span", "--ids", "base64")
    out = tmp_path / "calls.jsonl"
    result = CliRunner().invoke(cli, ["import", str(path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == CALLS
    assert {(m["session_id"], m["customer"]) for m in (line["request"]["metadata"] for line in lines)} == {
        ("sess-a1", "acme"), ("sess-g1", "globex"), ("sess-a2", "acme")}
    assert all(len(line["request"]["metadata"]["source_record"]) == 16 for line in lines)  # base64 ids as hex


def test_log_event_mode_with_logs_in_the_spans_file(served, tmp_path):
    path = v2(served, tmp_path / "export.jsonl", "event")
    kinds = {next(iter(json.loads(line))) for line in path.read_text().splitlines()}
    assert kinds == {"resourceSpans", "resourceLogs"}
    check_sessions(_calls(path), tools=False)


def test_log_event_mode_pretty_printed_with_base64_ids(served, tmp_path):
    path = v2(served, tmp_path / "export.json", "event", "--ids", "base64", "--pretty")
    assert path.read_text().startswith("{\n")
    check_sessions(_calls(path), tools=False)


def test_log_event_mode_with_logs_in_a_file_of_their_own(served, tmp_path):
    spans = v2(served, tmp_path / "spans.jsonl", "event", "--logs-out", str(tmp_path / "logs.jsonl"))
    check_sessions(_calls(spans, logs=(tmp_path / "logs.jsonl",)), tools=False)
    without = _calls(spans)  # the spans alone hold no content
    assert len(without) == CALLS and all(c.request["messages"] == [] for c in without)
    out = tmp_path / "calls.jsonl"
    result = CliRunner().invoke(cli, ["import", str(spans), str(tmp_path / "logs.jsonl"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert all(json.loads(line)["response"]["choices"][0]["message"]["tool_calls"]
               for line in out.read_text().splitlines())


def test_content_capture_off_reads_the_calls_without_messages(served, tmp_path):
    path = v2(served, tmp_path / "spans.jsonl", "none")
    check_sessions(_calls(path), tools=False, content=False)


def test_two_recordings_of_the_same_sessions_pair_every_call(served, tmp_path):
    a = v2(served, tmp_path / "a.jsonl", "span")
    b = v2(served, tmp_path / "b.jsonl", "event", "--ids", "base64")
    with Store(tmp_path / "c.duckdb") as store:
        _, counts = compare_logs(store, a, b, CompareOptions(schema_dir=None))
        statuses = store.query("SELECT match_status, drift_kind, count(*) FROM calls GROUP BY ALL")[1]
    assert counts.matched == CALLS
    assert statuses == [("matched", "identical", CALLS)]  # the same answers, whichever mode carried them
