"""The Langfuse SDK (v5, OpenTelemetry-based) and its OpenAI integration, recorded for real (`record_langfuse`),
read with no options: its spans as the SDK's own exporter sends them to a Langfuse server (`toolaudit collect`
here, on Langfuse's `/api/public/otel/v1/traces` with the SDK's basic auth, which must not be stored), and
with the trace attributes only on the agent span (inherited by the generations)."""

from __future__ import annotations

import base64

import pytest

from tests.tracing.agent import CALLS, SESSIONS
from tests.tracing.checks import (
    check_sessions,
    collected_calls,
    compare,
    import_calls,
    imported,
    record,
    record_live,
    selected,
)

pytest.importorskip("langfuse")
KEYS = (b"pk-lf-local-test", b"sk-lf-local-test")  # record_langfuse's throwaway keys


@pytest.fixture(scope="module")
def recordings(served, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("langfuse")
    collected = record_live("record_langfuse", served, out / "live", endpoint="--langfuse-host")
    return {"collected": collected, "sent": selected(collected),
            "root": record("record_langfuse", served, out / "root.jsonl", "--attach", "root")}


def test_live_sdk_export_to_toolaudit_collect_reads_with_no_options(recordings):
    calls, said = collected_calls(recordings["collected"])
    assert "(langfuse, detected)" in said and "0 error records, 3 skipped" in said
    assert "3 langfuse.observation.type 'agent'" in said
    check_sessions(calls)
    assert calls[0].request["max_tokens"] == 3 and calls[0].request["temperature"] == 0
    assert calls[0].response["usage"]["completion_tokens"] == 3
    forced, _ = import_calls(recordings["sent"], "--format", "langfuse")
    assert imported(forced) == calls
    stored = b"".join(p.read_bytes() for p in recordings["collected"].iterdir() if p.is_file())
    assert all(key not in stored for key in KEYS) and base64.b64encode(b":".join(KEYS)) not in stored


@pytest.mark.parametrize("key", ["metadata.customer", "langfuse.trace.metadata.customer"])
def test_customer_from_propagated_metadata(recordings, key):
    calls, _ = import_calls(recordings["sent"], "--customer-key", key)
    check_sessions(imported(calls))  # the JSON-encoded "\"acme\"" decoded


def test_trace_attributes_on_the_agent_span_only_are_inherited(recordings):
    calls, said = import_calls(recordings["root"])
    assert "(langfuse, detected)" in said
    check_sessions(imported(calls))
    calls, _ = import_calls(recordings["root"], "--customer-key", "metadata.customer")
    check_sessions(imported(calls))


def test_compare_of_two_recordings_pairs_every_call(recordings, tmp_path):
    counts, rows = compare(recordings["sent"], recordings["root"], tmp_path / "l.duckdb")
    assert counts.formats == {"baseline": "langfuse", "candidate": "langfuse"}
    assert counts.matched == CALLS and counts.baseline_only == counts.candidate_only == 0
    assert counts.baseline.errors == counts.candidate.errors == 0
    assert {key[0] for key in rows} == {s.session_id for s in SESSIONS}
    assert {customer for customer, _ in rows.values()} == {"acme", "globex"}
