"""Traceloop's OpenLLMetry `opentelemetry-instrumentation-openai` (0.62.4): the real openai client, instrumented by the
real library, calls a served model; the spans are written as a collector writes them, or sent live by the real
OTLP/HTTP exporter to a `toolaudit collect` subprocess, and read back with no options. The session and customer are
association properties (`traceloop.association.properties.session_id` / `customer_id`), as traceloop-sdk's span
processor sets them (see tests/tracing/libraries.py)."""

from __future__ import annotations

from tests.tracing.agent import CALLS
from tests.tracing.checks import check_sessions, collected_calls, record, record_live
from toolaudit.compare.logs import CompareOptions, compare_logs
from toolaudit.ingest.traces import TraceCall, read_trace
from toolaudit.store import Store


def openllmetry(served, out, *options: str):
    return record("record", served, out, "openllmetry", "span", *options)


def _calls(path) -> list[TraceCall]:
    items = list(read_trace(path))
    assert [i for i in items if not isinstance(i, TraceCall)] == []
    return items


def test_spans_read_every_call_tool_session_and_customer(served, tmp_path):
    check_sessions(_calls(openllmetry(served, tmp_path / "spans.jsonl")))


def test_live_export_to_toolaudit_collect_reads_with_no_options(served, tmp_path):
    calls, said = collected_calls(record_live("record", served, tmp_path, "openllmetry", "span"))
    assert "(otel, detected)" in said and "0 error records" in said
    check_sessions(calls)


def test_pretty_printed_document_with_base64_ids(served, tmp_path):
    path = openllmetry(served, tmp_path / "spans.json", "--ids", "base64", "--pretty")
    assert path.read_text().startswith("{\n")
    check_sessions(_calls(path))


def test_two_recordings_of_the_same_sessions_pair_every_call(served, tmp_path):
    a = openllmetry(served, tmp_path / "a.jsonl")
    b = openllmetry(served, tmp_path / "b.jsonl")
    with Store(tmp_path / "c.duckdb") as store:
        _, counts = compare_logs(store, a, b, CompareOptions(schema_dir=None))
        statuses = store.query("SELECT match_status, drift_kind, count(*) FROM calls GROUP BY ALL")[1]
    assert counts.matched == CALLS
    assert statuses == [("matched", "identical", CALLS)]  # the same answers
