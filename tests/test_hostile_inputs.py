"""Hostile inputs, wider: each trace format's hostile shapes and hostile tool schemas. Each case is bounded (a
compare of a handful of calls; `--durations` shows the seconds, well under 5 on 2 cores) and ends as a clear
error row or schema issue, with nothing else lost: the good call beside it is still matched and every record is
accounted for."""

from __future__ import annotations

import json

import pytest
from conftest import CLOSE_TOOL, line, tool_call, write_jsonl
from format_records import otel_span, otlp

from toolaudit.compare.logs import CompareOptions, compare_logs
from toolaudit.store import Store

GOOD_OTEL = otlp(otel_span("good1", session="good"))


def _deep_kvlist_line(depth: int) -> bytes:
    """A span whose attribute is a key-value list nested `depth` deep, written as text (json.dumps recurses)."""
    inner = '{"kvlistValue": {"values": [{"key": "k", "value": ' * depth + '{"stringValue": "leaf"}' + "}]}}" * depth
    raw = json.dumps(otlp(otel_span("bad1", session="x")))
    return raw.replace('"attributes": [', f'"attributes": [{{"key": "x.deep", "value": {inner}}}, ', 1).encode()


def _with_attr(key: str, value: dict) -> dict:
    sp = otel_span("bad1", session="x")
    sp["attributes"].append({"key": key, "value": value})
    return otlp(sp)


def _without(field: str) -> dict:
    sp = otel_span("bad1", session="x")
    del sp[field]
    return otlp(sp)


def _resource_attrs(attrs) -> dict:
    doc = otlp(otel_span("bad1", session="x"))
    doc["resourceSpans"][0]["resource"]["attributes"] = attrs
    return doc


# (id, bad record, field named, words in the message; None: the record is read, nothing is an error)
SPAN_CASES = [
    ("no-trace-id", _without("traceId"), "traceId", "missing"),
    ("trace-id-number", otlp({**otel_span("bad1", session="x"), "traceId": 42}), "traceId", "missing"),
    ("stringValue-number", _with_attr("x.n", {"stringValue": 5}), "x.n", "stringValue must be a string"),
    ("boolValue-string", _with_attr("x.b", {"boolValue": "yes"}), "x.b", "boolValue must be true or false"),
    ("arrayValue-string", _with_attr("x.a", {"arrayValue": "1,2"}), "x.a", "arrayValue must be"),
    ("doubleValue-word", _with_attr("x.d", {"doubleValue": "lots"}), "x.d", "is not a number"),
    ("unknown-anyvalue", _with_attr("x.u", {"fancyValue": 1}), "x.u", "unknown AnyValue kind"),
    ("attributes-object", otlp({**otel_span("bad1", session="x"), "attributes": {"a": 1}}), "attributes",
     "must be a list"),
    ("resource-attrs-string", _resource_attrs("service=agent"), "resource.attributes", "must be a list"),
    ("events-object", otlp({**otel_span("bad1", session="x"), "events": {"name": "e"}}), "events", "must be a list"),
    ("start-time-word", otlp({**otel_span("bad1", session="x"), "startTimeUnixNano": "noon"}), "startTimeUnixNano",
     "not an integer"),
    ("deep-kvlist-5000", _deep_kvlist_line(5000), None, "depth limit exceeded"),
    ("invalid-utf8-in-value", None, None, "invalid UTF-8"),
]


def _invalid_utf8_line() -> bytes:
    raw = json.dumps(otlp(otel_span("bad1", session="x"))).encode()
    return raw.replace(b'"gen_ai.request.model"', b'"gen_ai.request.\xff\xfemodel"', 1)


def compare(tmp_path, baseline: list, candidate: list, schema_dir=None):
    b = write_jsonl(tmp_path / "b.jsonl", baseline)
    c = write_jsonl(tmp_path / "c.jsonl", candidate)
    store = Store(tmp_path / "audit.duckdb")
    run_id, counts = compare_logs(store, b, c, CompareOptions(schema_dir=schema_dir))
    assert store.run_row(run_id)["status"] == "complete"
    for stats in (counts.baseline, counts.candidate):
        assert stats.records == stats.calls + stats.errors + stats.skipped
    return store, run_id, counts


@pytest.mark.parametrize("case", SPAN_CASES, ids=[c[0] for c in SPAN_CASES])
def test_hostile_span_is_an_error_row_and_the_good_call_is_kept(tmp_path, case):
    _, bad, field, needle = case
    bad = _invalid_utf8_line() if bad is None else bad
    store, run_id, counts = compare(tmp_path, [GOOD_OTEL], [GOOD_OTEL, bad])
    assert counts.matched == 1 and counts.candidate.errors == 1, counts
    errors = store.rows("SELECT * FROM trace_errors WHERE run_id = ?", [run_id])
    assert len(errors) == 1 and errors[0]["line"] == 2
    assert needle in errors[0]["message"], errors[0]["message"]
    if field is not None:
        assert errors[0]["field"] == field, errors[0]


def test_a_huge_attribute_value_is_read_whole(tmp_path):
    """A 20 MB attribute (a giant system prompt) is kept, not cut or refused."""
    system = json.dumps([{"type": "text", "content": "x" * 20_000_000}])
    big = otlp(otel_span("big1", session="good", **{"gen_ai.system_instructions": system}))
    store, run_id, counts = compare(tmp_path, [big], [big])
    assert counts.matched == 1 and counts.candidate.errors == 0


def _line_with_tool(schema: dict, arguments: dict, session: str = "s1") -> dict:
    tool = {"type": "function", "function": {"name": "hostile", "parameters": schema}}
    return line(session=session, calls=[tool_call("hostile", arguments)], tools=[tool, CLOSE_TOOL])


RECURSIVE = {"type": "object", "properties": {"child": {"$ref": "#"}, "n": {"type": "integer"}}}
WIDE = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(10_000)},
        "required": [f"p{i}" for i in range(0, 10_000, 100)]}
HUGE_ENUM = {"type": "object", "properties": {"code": {"enum": [f"c{i}" for i in range(200_000)]}}}
SELF_LOOP = {"$ref": "#/definitions/a", "definitions": {"a": {"$ref": "#/definitions/b"},
                                                        "b": {"$ref": "#/definitions/a"}}}
SCHEMA_CASES = [
    ("recursive-ref", RECURSIVE, {"child": {"child": {"n": 1}}, "n": 2}, {"child": {"child": {"n": "x"}}, "n": 2}),
    ("ten-thousand-properties", WIDE, {f"p{i}": i for i in range(0, 10_000, 100)},
     {f"p{i}": i for i in range(0, 9_900, 100)}),
    ("enormous-enum", HUGE_ENUM, {"code": "c199999"}, {"code": "nope"}),
]


@pytest.mark.parametrize("case", SCHEMA_CASES, ids=[c[0] for c in SCHEMA_CASES])
def test_hostile_schema_validates_in_bounded_time(tmp_path, case):
    """The valid side validates, the invalid side is schema_broken: nothing hangs or is lost."""
    _, schema, good_args, bad_args = case
    store, run_id, counts = compare(tmp_path, [_line_with_tool(schema, good_args)],
                                    [_line_with_tool(schema, bad_args)])
    assert counts.matched == 1 and counts.drifted == 1, counts
    call = store.rows("SELECT baseline_valid, candidate_valid, drift_kind FROM calls WHERE run_id = ?", [run_id])
    assert [(c["baseline_valid"], c["candidate_valid"]) for c in call] == [(True, False)], call


def test_a_ref_cycle_is_not_a_hang_and_the_call_is_still_diffed(tmp_path):
    """`a -> b -> a` never reaches a schema: validity is unknown on both sides (no verdict from a schema that
    cannot judge), and the arguments are still diffed."""
    store, run_id, counts = compare(tmp_path, [_line_with_tool(SELF_LOOP, {"x": 1})],
                                    [_line_with_tool(SELF_LOOP, {"x": 2})])
    assert counts.matched == 1
    calls = store.rows("SELECT drift_kind, baseline_valid, candidate_valid FROM calls WHERE run_id = ?", [run_id])
    assert [(c["drift_kind"], c["baseline_valid"], c["candidate_valid"]) for c in calls] == [
        ("arguments_changed", None, None)]
