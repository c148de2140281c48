"""The Langfuse SDK (v5, OpenTelemetry-based) and its OpenAI integration, recorded for real (`record_langfuse`),
read with no options: its spans as the SDK sends them to a Langfuse server (a loopback receiver here), and with
the trace attributes only on the agent span (inherited by the generations)."""

from __future__ import annotations

import pytest

from tests.tracing.agent import CALLS, SESSIONS
from tests.tracing.checks import assert_agent_calls, compare, import_calls, record
from tests.tracing.receiver import Receiver

pytest.importorskip("langfuse")


@pytest.fixture(scope="module")
def recordings(served, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("langfuse")
    receiver, collector = Receiver(out / "sent.jsonl"), Receiver(out / "collected.jsonl")
    try:
        sent = record("record_langfuse", served, receiver.out, "--langfuse-host", receiver.root, sent=True)
        assert receiver.requests >= 1 and receiver.authorized == receiver.requests
        root = record("record_langfuse", served, out / "root.jsonl", "--attach", "root", "--otlp-endpoint",
                      collector.root)
    finally:
        receiver.close()
        collector.close()
    return {"sent": sent, "root": root, "collected": collector.out}


def test_sdk_spans_sent_to_langfuse_read_with_no_options(recordings):
    calls, said = import_calls(recordings["sent"])
    assert "(langfuse, detected)" in said and "0 error records, 3 skipped" in said
    assert "3 langfuse.observation.type 'agent'" in said
    assert_agent_calls(calls)
    assert calls[0]["request"]["max_tokens"] == 3 and calls[0]["request"]["temperature"] == 0
    assert calls[0]["response"]["usage"]["completion_tokens"] == 3
    forced, _ = import_calls(recordings["sent"], "--format", "langfuse")
    assert forced == calls


@pytest.mark.parametrize("key", ["metadata.customer", "langfuse.trace.metadata.customer"])
def test_customer_from_propagated_metadata(recordings, key):
    calls, _ = import_calls(recordings["sent"], "--customer-key", key)
    assert_agent_calls(calls)  # the JSON-encoded "\"acme\"" decoded


def test_trace_attributes_on_the_agent_span_only_are_inherited(recordings):
    calls, said = import_calls(recordings["root"])
    assert "(langfuse, detected)" in said
    assert_agent_calls(calls)
    collected, _ = import_calls(recordings["collected"])  # the same spans, sent to an OTLP endpoint
    assert collected == calls
    calls, _ = import_calls(recordings["root"], "--customer-key", "metadata.customer")
    assert_agent_calls(calls)


def test_compare_of_two_recordings_pairs_every_call(recordings, tmp_path):
    counts, rows = compare(recordings["sent"], recordings["root"], tmp_path / "l.duckdb")
    assert counts.formats == {"baseline": "langfuse", "candidate": "langfuse"}
    assert counts.matched == CALLS and counts.baseline_only == counts.candidate_only == 0
    assert counts.baseline.errors == counts.candidate.errors == 0
    assert {key[0] for key in rows} == {s.session_id for s in SESSIONS}
    assert {customer for customer, _ in rows.values()} == {"acme", "globex"}
