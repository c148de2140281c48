"""Arize's OpenInference OpenAI instrumentation, recorded for real (`record_oi`), read with no options: the
sessions from `using_session`, customers from `using_user` (`user.id`) or, named with `--customer-key
metadata.customer`, from `using_metadata` (a JSON string attribute). Live: the spans sent by the real OTLP/HTTP
exporter to `toolaudit collect`; and as a collector's file exporter writes them."""

from __future__ import annotations

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

pytest.importorskip("openinference.instrumentation.openai")


@pytest.fixture(scope="module")
def recordings(served, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("oi")
    return {"collected": record_live("record_oi", served, out / "live", "--customer-via", "both"),
            "metadata": record("record_oi", served, out / "metadata.jsonl", "--customer-via", "metadata")}


def test_live_export_to_toolaudit_collect_reads_with_no_options(recordings):
    calls, said = collected_calls(recordings["collected"])
    assert "(openinference, detected)" in said and "0 error records, 0 skipped" in said
    check_sessions(calls)
    assert calls[0].request["max_tokens"] == 3 and calls[0].request["temperature"] == 0
    assert calls[0].response["usage"]["completion_tokens"] == 3


def test_customer_from_using_metadata_with_customer_key(recordings):
    calls, _ = import_calls(recordings["metadata"])
    check_sessions(imported(calls), customers=False)  # no user.id: no customer unless asked for
    calls, _ = import_calls(recordings["metadata"], "--customer-key", "metadata.customer")
    check_sessions(imported(calls))


def test_compare_of_two_recordings_pairs_every_call(recordings, tmp_path):
    counts, rows = compare(selected(recordings["collected"]), recordings["metadata"], tmp_path / "a.duckdb",
                           customer_key="metadata.customer")
    assert counts.formats == {"baseline": "openinference", "candidate": "openinference"}
    assert counts.matched == CALLS and counts.baseline_only == counts.candidate_only == 0
    assert counts.baseline.errors == counts.candidate.errors == 0
    assert {key[0] for key in rows} == {s.session_id for s in SESSIONS}
    assert {customer for customer, _ in rows.values()} == {"acme", "globex"}
