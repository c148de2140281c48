"""The real OpenTelemetry SDK and its real OTLP/HTTP exporter (protobuf, gzip, an Authorization header) sending
to a `toolaudit collect` subprocess: the chat and tool spans are stored with the SDK's own ids, the HTTP spans
dropped, the header nowhere, and the stored file reads as OTel GenAI calls with their sessions and customers."""

from __future__ import annotations

from toolaudit.collect.files import collected_files
from toolaudit.ingest.traces import TraceCall, TraceStats, read_trace

from .support import export_with_sdk, stored_spans


def test_the_otlp_exporter_of_the_sdk(receiver):
    conversations = {"conv-1": "acme", "conv-2": "globex"}
    sent = export_with_sdk(receiver.url, conversations, calls=2, headers={"Authorization": "Bearer sk-secret-77"})
    stored = stored_spans(receiver.folder)
    ids = {(s["traceId"], s["spanId"]) for s in stored if s["name"] == "chat m"}
    assert ids == {pair for pairs in sent.values() for pair in pairs}
    assert sorted({s["name"] for s in stored}) == ["chat m", "execute_tool search_tickets"]  # no POST /agent
    [path] = collected_files(receiver.folder)
    assert b"sk-secret-77" not in path.read_bytes()
    stats = TraceStats()
    calls = [c for c in read_trace(path, require_response=True, stats=stats) if isinstance(c, TraceCall)]
    assert stats.errors == 0 and len(calls) == 4
    assert {(c.session_id, c.customer) for c in calls} == {("conv-1", "acme"), ("conv-2", "globex")}
    assert all(c.request["tools"][0]["function"]["name"] == "search_tickets" for c in calls)
