"""Traceloop's OpenLLMetry `opentelemetry-instrumentation-openai` (0.62.4): the real openai client, instrumented by
the real library, calls a served model; the spans are written as a collector writes them and read back with no
options. The session and customer are association properties (`traceloop.association.properties.session_id` /
`customer_id`), as traceloop-sdk's span processor sets them (see tests/tracing/libraries.py)."""

from __future__ import annotations

from tests.tracing.agent import CALLS, check_sessions
from tests.tracing.record import record
from toolaudit.compare.logs import CompareOptions, compare_logs
from toolaudit.ingest.traces import TraceCall, read_trace
from toolaudit.store import Store


def _calls(path) -> list[TraceCall]:
    items = list(read_trace(path))
    assert [i for i in items if not isinstance(i, TraceCall)] == []
    return items


def test_spans_read_every_call_tool_session_and_customer(served, tmp_path):
    check_sessions(_calls(record(served, tmp_path / "spans.jsonl", "openllmetry", "span")))


def test_pretty_printed_document_with_base64_ids(served, tmp_path):
    path = record(served, tmp_path / "spans.json", "openllmetry", "span", "--ids", "base64", "--pretty")
    assert path.read_text().startswith("{\n")
    check_sessions(_calls(path))


def test_two_recordings_of_the_same_sessions_pair_every_call(served, tmp_path):
    a = record(served, tmp_path / "a.jsonl", "openllmetry", "span")
    b = record(served, tmp_path / "b.jsonl", "openllmetry", "span")
    with Store(tmp_path / "c.duckdb") as store:
        _, counts = compare_logs(store, a, b, CompareOptions(schema_dir=None))
        statuses = store.query("SELECT match_status, drift_kind, count(*) FROM calls GROUP BY ALL")[1]
    assert counts.matched == CALLS
    assert statuses == [("matched", "identical", CALLS)]  # the same answers
