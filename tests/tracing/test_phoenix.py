"""Phoenix's own span export (its REST API's span JSON) of real OpenInference spans, read with no options: the
same calls, sessions and customers as the OTLP export of those spans."""

from __future__ import annotations

import json

import pytest

from tests.tracing.agent import CALLS
from tests.tracing.checks import check_sessions, compare, import_calls, imported, record
from tests.tracing.phoenix_export import nested, phoenix_spans
from toolaudit.ingest import registry

pytest.importorskip("openinference.instrumentation.openai")


def keyed(calls: list[dict]) -> dict:
    """Calls by (session, index), the span id left out (the API lists sessions newest first: another order)."""
    out = {}
    for call in calls:
        meta = dict(call["request"]["metadata"])
        del meta["source_record"]
        out[meta["session_id"], meta["call_index"]] = {**call, "request": {**call["request"], "metadata": meta}}
    return out


@pytest.fixture(scope="module")
def recorded(served, tmp_path_factory):
    out = tmp_path_factory.mktemp("phoenix")
    return record("record_oi", served, out / "otlp.jsonl", "--customer-via", "both")


def test_a_phoenix_span_export_reads_with_no_options(recorded, tmp_path):
    spans = phoenix_spans(recorded)
    assert {s["span_kind"] for s in spans} == {"LLM"} and "metadata.customer" in spans[0]["attributes"]
    path = tmp_path / "spans.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in reversed(spans)))  # the API lists newest first
    assert registry.detect_format(str(path)) == ("phoenix", 1)
    calls, said = import_calls(path)
    assert "(phoenix, detected)" in said and "0 error records, 0 skipped" in said
    check_sessions(imported(calls))
    assert keyed(calls) == keyed(import_calls(recorded)[0])  # what the OTLP export of the same spans gives
    calls, _ = import_calls(path, "--customer-key", "metadata.customer")  # using_metadata, parsed by Phoenix
    check_sessions(imported(calls))


def test_pages_with_nested_attributes_and_inherited_sessions(recorded, tmp_path):
    spans = phoenix_spans(recorded)
    for span in spans:  # the session and customer only on a parent AGENT span (as a framework may put them)
        own = span["context"]["span_id"]
        parent_id = ("b" if own[0] == "a" else "a") + own[1:]  # never the span's own id
        parent = {**span, "context": {**span["context"], "span_id": parent_id},
                  "span_kind": "AGENT", "attributes": {k: span["attributes"].pop(k) for k in ("session.id", "user.id")}}
        span["parent_id"] = parent["context"]["span_id"]
        span["attributes"] = nested(span["attributes"])
        span["__parent"] = parent
    lines = [{"data": [s.pop("__parent"), s], "next_cursor": None} for s in spans]
    path = tmp_path / "pages.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    calls, said = import_calls(path)
    assert f"0 error records, {CALLS} skipped" in said  # the AGENT spans
    check_sessions(imported(calls))


def test_compare_phoenix_against_otlp_pairs_every_call(recorded, tmp_path):
    path = tmp_path / "spans.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in phoenix_spans(recorded)))
    counts, rows = compare(recorded, path, tmp_path / "c.duckdb")
    assert counts.formats == {"baseline": "openinference", "candidate": "phoenix"}
    assert counts.matched == CALLS and counts.baseline_only == counts.candidate_only == 0 == counts.drifted
    assert {customer for customer, _ in rows.values()} == {"acme", "globex"}
