"""A model-call span without a session or customer takes them from its parent spans, else from any span of its
trace: instrumentations put `gen_ai.conversation.id` / `session.id` / `user.id` on the agent span, which ends (and
is exported) after the model calls inside it. Read alone and compared (sharded: a call's session is only known
once the whole file is settled)."""

from __future__ import annotations

from conftest import write_jsonl
from format_records import otel_span, otlp, span

from toolaudit.compare.logs import CompareOptions, compare_logs
from toolaudit.ingest.shards import Shard
from toolaudit.ingest.traces import TraceCall, read_trace
from toolaudit.store import Store

T1, T2, T3 = "1" * 32, "2" * 32, "3" * 32


def _records() -> list[dict]:
    bare = {"session": None, "customer": None}
    return [
        # trace 1: two calls whose agent span (the parent) comes on a later line
        otlp(otel_span("c100000000000001", start=1, end=2, trace_id=T1, parentSpanId="a100000000000001", **bare),
             otel_span("c100000000000002", start=3, end=4, trace_id=T1, parentSpanId="a100000000000001", **bare)),
        # trace 2: the session two parents up, the customer only on an unrelated span of the trace
        otlp(otel_span("d200000000000001", start=5, end=6, trace_id=T2, parentSpanId="m200000000000001", **bare),
             span("m200000000000001", {"gen_ai.operation.name": "invoke_agent"}, trace_id=T2,
                  parentSpanId="r200000000000001"),
             span("r200000000000001", {"session.id": "sess-2"}, trace_id=T2),
             span("x200000000000001", {"enduser.id": "globex"}, trace_id=T2)),
        # trace 3: nothing to inherit: its trace is its session
        otlp(otel_span("e300000000000001", start=7, end=8, trace_id=T3, **bare)),
        otlp(span("a100000000000001", {"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "conv-1",
                                       "user.id": "acme"}, trace_id=T1, start=0, end=9)),
    ]


WANT = {"c100000000000001": ("conv-1", 0, "acme"), "c100000000000002": ("conv-1", 1, "acme"),
        "d200000000000001": ("sess-2", 0, "globex"), "e300000000000001": (T3, 0, None)}


def test_calls_inherit_session_and_customer_from_parents_then_trace(tmp_path):
    path = write_jsonl(tmp_path / "spans.jsonl", _records())
    calls = [c for c in read_trace(path) if isinstance(c, TraceCall)]
    assert {c.record: (c.session_id, c.call_index, c.customer) for c in calls} == WANT
    for call in calls:  # the request's metadata says the same, as `toolaudit import` writes it
        assert call.request["metadata"]["session_id"] == call.session_id
        assert call.request["metadata"].get("customer") == call.customer


def test_a_named_session_key_is_inherited_too(tmp_path):
    path = write_jsonl(tmp_path / "spans.jsonl", _records())
    items = list(read_trace(path, session_key="session.id"))
    calls = {c.record: c.session_id for c in items if isinstance(c, TraceCall)}
    assert calls == {"d200000000000001": "sess-2"}
    missing = sorted(e.field for e in items if not isinstance(e, TraceCall))
    assert missing == ["session.id"] * 3


def test_sharded_compare_places_each_call_by_its_inherited_session(tmp_path):
    path = write_jsonl(tmp_path / "spans.jsonl", _records())
    found = []
    for index in (1, 2):
        with Store(tmp_path / f"s{index}.duckdb") as store:
            compare_logs(store, path, path, CompareOptions(schema_dir=None, shard=Shard(index, 2)))
            found += store.query("SELECT session_id, call_index, customer, match_status FROM calls")[1]
    assert sorted(found, key=str) == sorted([(s, i, c, "matched") for s, i, c in WANT.values()], key=str)


def test_parallel_ranges_settle_inherited_sessions_across_ranges(tmp_path):
    records = _records()
    filler = [otlp(*(span(f"f{i:05d}{j:010d}", {"http.method": "GET", "http.url": "x" * 200}, trace_id="f" * 32)
                     for j in range(4))) for i in range(1500)]
    path = write_jsonl(tmp_path / "spans.jsonl", records[:3] + filler + records[3:])  # agent span ranges later
    assert path.stat().st_size > 2 << 20
    with Store(tmp_path / "a.duckdb") as store:
        _, counts = compare_logs(store, path, path, CompareOptions(schema_dir=None, workers=2))
        found = store.query("SELECT session_id, call_index, customer FROM calls")[1]
    assert counts.matched == len(WANT)
    assert sorted(found, key=str) == sorted(WANT.values(), key=str)
