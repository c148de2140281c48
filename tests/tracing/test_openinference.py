"""Arize's OpenInference OpenAI instrumentation, recorded for real (`record_oi`), read with no options: the
sessions from `using_session`, customers from `using_user` (`user.id`) or, named with `--customer-key
metadata.customer`, from `using_metadata` (a JSON string attribute)."""

from __future__ import annotations

import pytest

from tests.tracing.agent import CALLS, SESSIONS
from tests.tracing.checks import assert_agent_calls, compare, import_calls, record
from tests.tracing.receiver import Receiver

pytest.importorskip("openinference.instrumentation.openai")


@pytest.fixture(scope="module")
def recordings(served, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("oi")
    collector = Receiver(out / "collected.jsonl")
    try:
        metadata = record("record_oi", served, out / "metadata.jsonl", "--customer-via", "metadata",
                          "--otlp-endpoint", collector.root)
    finally:
        collector.close()
    return {"both": record("record_oi", served, out / "both.jsonl", "--customer-via", "both"),
            "metadata": metadata, "collected": collector.out}


def test_openinference_spans_read_with_no_options(recordings):
    calls, said = import_calls(recordings["both"])
    assert "(openinference, detected)" in said and "0 error records, 0 skipped" in said
    assert_agent_calls(calls)
    assert calls[0]["request"]["max_tokens"] == 3 and calls[0]["request"]["temperature"] == 0
    assert calls[0]["response"]["usage"]["completion_tokens"] == 3


def test_customer_from_using_metadata_with_customer_key(recordings):
    calls, _ = import_calls(recordings["metadata"])
    assert_agent_calls(calls, customers=False)  # no user.id: no customer unless asked for
    calls, _ = import_calls(recordings["metadata"], "--customer-key", "metadata.customer")
    assert_agent_calls(calls)
    collected, _ = import_calls(recordings["collected"], "--customer-key", "metadata.customer")
    assert collected == calls  # the same spans, sent to an OTLP endpoint


def test_compare_of_two_recordings_pairs_every_call(recordings, tmp_path):
    counts, rows = compare(recordings["both"], recordings["metadata"], tmp_path / "a.duckdb",
                           customer_key="metadata.customer")
    assert counts.formats == {"baseline": "openinference", "candidate": "openinference"}
    assert counts.matched == CALLS and counts.baseline_only == counts.candidate_only == 0
    assert counts.baseline.errors == counts.candidate.errors == 0
    assert {key[0] for key in rows} == {s.session_id for s in SESSIONS}
    assert {customer for customer, _ in rows.values()} == {"acme", "globex"}
