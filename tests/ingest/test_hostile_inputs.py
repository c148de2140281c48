"""Hostile inputs, wider: each trace format's hostile shapes, hostile files and hostile tool schemas.

Every case is one compare of a good call and a hostile one (or a hostile file beside a good one), and must end
bounded (`DEADLINE_S`, well under 5 s on 2 cores; `--durations` shows the seconds) as a clear error row naming
line and field, a file-level error naming the file, or a schema issue, with nothing else lost: the good call
beside it is still matched and every record is accounted for (`records = calls + errors + skipped`). Giant
inputs are built once per module.
"""

from __future__ import annotations

import gzip
import json
import time

import pytest
from click.testing import CliRunner
from conftest import CLOSE_TOOL, line, tool_call, write_jsonl
from format_records import (
    generation,
    lf_trace,
    oi_attrs,
    oi_span,
    otel_span,
    otlp,
    responses_record,
    span,
)

from toolaudit import TraceError
from toolaudit.cli import cli
from toolaudit.compare.logs import CompareOptions, compare_logs
from toolaudit.store import Store

DEADLINE_S = 5.0
ANY = object()  # the error row's field is not checked (a line that is not JSON names none)


def phoenix_span(span_id: str = "good1", session: str = "good", **attributes) -> dict:
    flat = {k: v for k, v in oi_attrs(session=session).items() if k != "openinference.span.kind"}
    return {"id": "U3Bhbjox", "name": "llm", "context": {"trace_id": "t" * 32, "span_id": span_id},
            "span_kind": "LLM", "parent_id": None, "start_time": "2026-01-01T00:00:01Z",
            "end_time": "2026-01-01T00:00:02Z", "status_code": "OK", "status_message": "",
            "attributes": {**flat, **attributes}, "events": []}


def langfuse_span(span_id: str = "good1", session: str = "good", **attributes) -> dict:
    attrs = {"langfuse.observation.type": "generation", "langfuse.observation.model.name": "m",
             "session.id": session, "user.id": "acme",
             "langfuse.observation.input": json.dumps({"messages": [{"role": "user", "content": "close 1"}],
                                                       "tools": [CLOSE_TOOL]}),
             "langfuse.observation.output": json.dumps({"role": "assistant", "content": None, "tool_calls": [
                 tool_call("close_ticket", {"ticket_id": 1})]})}
    attrs.update(attributes)
    return otlp(span(span_id, {k: v for k, v in attrs.items() if v is not None}))


GOOD = {
    "openai": line(session="good", calls=[tool_call("close_ticket", {"ticket_id": 1})]),
    "responses": responses_record(session="good"),
    "otel": otlp(otel_span("good1", session="good")),
    "openinference": otlp(oi_span("good1", session="good")),
    "langfuse": lf_trace("trg", session="good", observations=[generation("good1", "trg")]),
    "langfuse-sdk": langfuse_span(),
    "phoenix": phoenix_span(),
}
FORMAT = {"langfuse-sdk": "langfuse"}  # the registered format name, where the case's key is not one

DEEP = 10_000


def deep_array(depth: int = DEEP) -> str:
    return "[" * depth + "]" * depth


def deep_object(depth: int = DEEP) -> str:
    return '{"a":' * depth + "1" + "}" * depth


# -- builders of one bad record per format: each changes one thing of the format's good record -----------------
def openai_with(request: dict | None = None, message: dict | None = None, meta: dict | None = None) -> dict:
    rec = line(session="x", calls=[tool_call("close_ticket", {"ticket_id": 1})])
    rec["request"].update(request or {})
    rec["request"]["metadata"].update(meta or {})
    rec["response"]["choices"][0]["message"].update(message or {})
    return rec


def openai_args(arguments) -> dict:
    call = {"id": "call_1", "type": "function", "function": {"name": "close_ticket", "arguments": arguments}}
    return openai_with(message={"tool_calls": [call]})


def openai_text(replace: str, by: str) -> bytes:
    """The bad line as text, for what json.dumps cannot write (lone surrogates, deep nesting, raw bytes)."""
    raw = json.dumps(openai_with())
    assert replace in raw
    return raw.replace(replace, by, 1).encode("utf-8", "surrogatepass")


def otel_attr(key: str, value: dict) -> dict:
    sp = otel_span("bad1", session="x")
    sp["attributes"].append({"key": key, "value": value})
    return otlp(sp)


def otel_field(**fields) -> dict:
    sp = {**otel_span("bad1", session="x"), **fields}
    return otlp({k: v for k, v in sp.items() if v is not None})


def otel_text(replace: str, by: str, doc: dict | None = None) -> bytes:
    raw = json.dumps(doc if doc is not None else otlp(otel_span("bad1", session="x")))
    assert replace in raw
    return raw.replace(replace, by, 1).encode("utf-8", "surrogatepass")


def deep_kvlist_line(depth: int) -> bytes:
    """A span whose attribute is a key-value list nested `depth` deep, written as text (json.dumps recurses)."""
    inner = '{"kvlistValue": {"values": [{"key": "k", "value": ' * depth + '{"stringValue": "leaf"}' + "}]}}" * depth
    return otel_text('"attributes": [', f'"attributes": [{{"key": "x.deep", "value": {inner}}}, ')


def resource_attrs(attrs) -> dict:
    doc = otlp(otel_span("bad1", session="x"))
    doc["resourceSpans"][0]["resource"]["attributes"] = attrs
    return doc


def oi_with(**attrs) -> dict:
    return otlp(oi_span("bad1", session="x", **attrs))


def lf_with(**fields) -> dict:
    return lf_trace("tr2", session="x", observations=[generation("bad1", "tr2", **fields)])


def phoenix_with(**fields) -> dict:
    return {**phoenix_span("bad1", session="x"), **fields}


def langfuse_span_text(replace: str, by: str) -> bytes:
    raw = json.dumps(langfuse_span("bad1", "x"))
    assert replace in raw
    return raw.replace(replace, by, 1).encode("utf-8", "surrogatepass")


def phoenix_text(replace: str, by: str) -> bytes:
    raw = json.dumps(phoenix_span("bad1", session="x"))
    assert replace in raw
    return raw.replace(replace, by, 1).encode("utf-8", "surrogatepass")


NOT_ID = "must be a string (hex or base64)"

# (id, format, bad record, expected): expected is ("error", field or ANY, words in the message), or ("read",
# calls the bad record adds) for hostile but legal input that is read as a call
RECORD_CASES = [
    # -- OpenAI Chat Completions log ---------------------------------------------------------------------------
    ("openai-messages-string", "openai", openai_with(request={"messages": "hi"}), ("error", "request.messages",
                                                                                    "must be a list")),
    ("openai-content-number", "openai", openai_with(request={"messages": [{"role": "user", "content": 5}]}),
     ("read", 1)),  # content only feeds the prompt shown; the call is compared
    ("openai-tool-calls-dict", "openai", openai_with(message={"tool_calls": {"id": "c"}}), ("read", 1)),
    ("openai-arguments-object", "openai", openai_args({"ticket_id": 1}), ("read", 1)),
    ("openai-arguments-number", "openai", openai_args(5), ("read", 1)),
    ("openai-session-number", "openai", openai_with(meta={"session_id": 42}), ("read", 1)),
    ("openai-call-index-huge", "openai", openai_with(meta={"call_index": str(10**30)}),
     ("error", "request.metadata.call_index", "must be an integer from 0 to 2147483647")),
    ("openai-call-index-minus-zero", "openai", openai_text('"session_id": "x"', '"session_id": "x", "call_index": -0'),
     ("read", 1)),
    ("openai-arguments-deep-10k", "openai", openai_args(deep_array()), ("read", 1)),
    ("openai-messages-deep-10k", "openai", openai_text('"content": "find open tickets"', f'"content": {deep_array()}'),
     ("error", ANY, "not valid JSON")),
    ("openai-lone-surrogate-value", "openai", openai_text("find open tickets", "find \\ud800 tickets"),
     ("error", ANY, "surrogate")),
    ("openai-lone-surrogate-key", "openai", openai_text('"session_id": "x"', '"session_id": "x", "\\udc00": 1'),
     ("error", ANY, "surrogate")),
    ("openai-invalid-utf8-key", "openai", json.dumps(openai_with()).encode().replace(
        b'"model"', b'"mo\xff\xfedel"', 1), ("error", ANY, "invalid UTF-8")),
    ("openai-nul-escape", "openai", openai_text("find open tickets", "find\\u0000open"), ("read", 1)),
    ("openai-raw-nul-byte", "openai", openai_text("find open tickets", "find\x00open"),
     ("error", ANY, "not valid JSON")),
    ("openai-1e400", "openai", openai_text('"model": "m"', '"model": "m", "temperature": 1e400'),
     ("error", None, "number is infinity when parsed as double")),
    ("openai-nan", "openai", openai_text('"model": "m"', '"model": "m", "temperature": NaN'),
     ("error", ANY, "NaN")),
    ("openai-tool-call-id-number", "openai", openai_with(message={"tool_calls": [
        {"id": 7, "type": "function", "function": {"name": "close_ticket", "arguments": "{}"}}]}), ("read", 1)),
    ("openai-system-fingerprint-number", "openai",  # stored as no fingerprint (it crashed the scan's Arrow table)
     {**openai_with(), "response": {**openai_with()["response"], "system_fingerprint": 7}}, ("read", 1)),
    # -- Responses API log -------------------------------------------------------------------------------------
    ("responses-input-number", "responses", {**responses_record(session="x"), "request": {
        "input": 5, "metadata": {"session_id": "x"}}},
     ("error", "request.input", "must be a string or a list of items, got int")),
    ("responses-arguments-object", "responses", responses_record(session="x", arguments={"ticket_id": 1}),
     ("read", 1)),
    ("responses-output-deep-10k", "responses", json.dumps(responses_record(session="x")).replace(
        '"output": [', f'"output": [{deep_array()}, ', 1).encode(), ("error", ANY, "not valid JSON")),
    ("responses-call-id-number", "responses", {**responses_record(session="x"), "response": {
        "id": "r", "output": [{"type": "function_call", "call_id": 9, "name": "close_ticket",
                               "arguments": "{}"}]}}, ("read", 1)),
    ("responses-arguments-number", "responses", responses_record(session="x", arguments=5), ("read", 1)),
    ("responses-invalid-utf8", "responses", json.dumps(responses_record(session="x")).encode().replace(
        b'"be brief"', b'"be \xc3\x28brief"'), ("error", None, "invalid UTF-8 at byte")),
    # -- OTel GenAI spans --------------------------------------------------------------------------------------
    ("otel-no-trace-id", "otel", otel_field(traceId=None), ("error", "traceId", "missing")),
    ("otel-trace-id-number", "otel", otel_field(traceId=42), ("error", "traceId", f"{NOT_ID}, got 42")),
    ("otel-span-id-number", "otel", otel_field(spanId=42), ("error", "spanId", f"{NOT_ID}, got 42")),
    ("otel-stringValue-number", "otel", otel_attr("x.n", {"stringValue": 5}), ("error", "x.n",
                                                                               "stringValue must be a string")),
    ("otel-boolValue-string", "otel", otel_attr("x.b", {"boolValue": "yes"}),
     ("error", "x.b", "boolValue must be true or false")),
    ("otel-arrayValue-string", "otel", otel_attr("x.a", {"arrayValue": "1,2"}), ("error", "x.a",
                                                                                 "arrayValue must be")),
    ("otel-doubleValue-word", "otel", otel_attr("x.d", {"doubleValue": "lots"}), ("error", "x.d",
                                                                                  "is not a number")),
    ("otel-intValue-word", "otel", otel_attr("gen_ai.usage.input_tokens", {"intValue": "many"}),
     ("error", "gen_ai.usage.input_tokens", "not an integer")),
    ("otel-unknown-anyvalue", "otel", otel_attr("x.u", {"fancyValue": 1}), ("error", "x.u",
                                                                            "unknown AnyValue kind")),
    ("otel-anyvalue-two-kinds", "otel", otel_attr("gen_ai.request.temperature", {"doubleValue": 0.5,
                                                                                 "stringValue": "hot"}),
     ("error", "gen_ai.request.temperature", "an AnyValue holds one kind, got 2")),
    ("otel-anyvalue-no-kind", "otel", otel_attr("x.none", {}), ("read", 1)),
    ("otel-array-mixed-kinds", "otel", otel_attr("gen_ai.request.stop_sequences", {"arrayValue": {"values": [
        {"stringValue": "a"}, {"intValue": "1"}, {"kvlistValue": {"values": []}}]}}), ("read", 1)),
    ("otel-attributes-object", "otel", otel_field(attributes={"a": 1}), ("error", "attributes", "must be a list")),
    ("otel-resource-attrs-string", "otel", resource_attrs("service=agent"), ("error", "resource.attributes",
                                                                             "must be a list")),
    ("otel-events-object", "otel", otel_field(events={"name": "e"}), ("error", "events", "must be a list")),
    ("otel-start-time-word", "otel", otel_field(startTimeUnixNano="noon"), ("error", "startTimeUnixNano",
                                                                           "not an integer")),
    ("otel-start-time-1e400", "otel", otel_text('"startTimeUnixNano": "1000000000"', '"startTimeUnixNano": 1e400'),
     ("error", None, "number is infinity when parsed as double")),
    ("otel-deep-kvlist-5000", "otel", deep_kvlist_line(5000), ("error", None, "depth limit exceeded")),
    ("otel-messages-deep-10k", "otel", otlp(otel_span("bad1", session="x", **{
        "gen_ai.input.messages": deep_array()})), ("error", "gen_ai.input.messages", "not valid JSON")),
    ("otel-arguments-deep-10k", "otel", otlp(otel_span("bad1", session="x", **{
        "gen_ai.output.messages": json.dumps([{"role": "assistant", "finish_reason": "tool_call", "parts": [
            {"type": "tool_call", "id": "c", "name": "close_ticket", "arguments": deep_object()}]}])})),
     ("read", 1)),
    ("otel-invalid-utf8-in-key", "otel", otel_text('"gen_ai.request.model"', '"gen_ai.request.model"').replace(
        b'"gen_ai.request.model"', b'"gen_ai.request.\xff\xfemodel"', 1),
     ("error", None, "invalid UTF-8")),
    ("otel-lone-surrogate-value", "otel", otel_text('"stringValue": "m"', '"stringValue": "\\ud800"'),
     ("error", None, "surrogate")),
    ("otel-call-index-huge", "otel", otlp(otel_span("bad1", session="x", **{
        "request.metadata.call_index": str(10**30)})), ("read", 1)),
    ("otel-messages-object", "otel", otlp(otel_span("bad1", session="x", **{
        "gen_ai.input.messages": json.dumps({"role": "user"})})), ("error", "gen_ai.input.messages",
                                                                   "must be a JSON array of messages, got dict")),
    ("otel-parts-number", "otel", otlp(otel_span("bad1", session="x", **{
        "gen_ai.input.messages": json.dumps([{"role": "user", "parts": 5}])})),
     ("error", "gen_ai.input.messages[0].parts", "must be a list of message parts")),
    # -- OpenInference spans -----------------------------------------------------------------------------------
    ("oi-content-number", "openinference", oi_with(**{"llm.input_messages.1.message.content": 5}), ("read", 1)),
    ("oi-arguments-kvlist", "openinference", oi_with(**{
        "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments": {"ticket_id": 1}}), ("read", 1)),
    ("oi-message-index-huge", "openinference", oi_with(**{"llm.input_messages.99999999999.message.role": "user",
                                                          "llm.input_messages.99999999999.message.content": "x"}),
     ("error", "llm.input_messages.2", "missing while llm.input_messages.99999999999 exists")),
    ("oi-invocation-deep-10k", "openinference", oi_with(**{"llm.invocation_parameters": deep_object()}),
     ("error", "llm.invocation_parameters", "depth limit exceeded")),
    ("oi-no-trace-id", "openinference", otlp({k: v for k, v in oi_span("bad1", session="x").items()
                                              if k != "traceId"}), ("error", "traceId", "missing")),
    ("oi-tool-schema-list", "openinference", oi_with(**{"llm.tools.0.tool.json_schema": json.dumps([1, 2])}),
     ("error", "llm.tools.0.tool.json_schema[0]", "must be an object")),
    # -- Langfuse server export --------------------------------------------------------------------------------
    ("langfuse-observations-object", "langfuse", {**lf_trace("tr2", session="x"), "observations": {"a": 1}},
     ("error", None, "not a Langfuse trace")),
    ("langfuse-content-number", "langfuse", lf_with(input={"messages": [{"role": "user", "content": 5}]}),
     ("read", 1)),
    ("langfuse-tool-calls-dict", "langfuse", lf_with(output={"role": "assistant", "tool_calls": {"id": "c"}}),
     ("error", "output.tool_calls", "must be a list")),
    ("langfuse-id-number", "langfuse", lf_trace("tr2", session="x", observations=[generation(7, "tr2")]),
     ("error", "id", "must be a non-empty string, got int '7'")),
    ("langfuse-start-time-number", "langfuse", lf_with(start=1767225601),
     ("error", "startTime", "must be an ISO 8601 time string, got int")),
    ("langfuse-no-trace-id", "langfuse", {k: v for k, v in generation("bad1", "tr2").items() if k != "traceId"},
     ("error", "traceId", "missing: without a trace id or a sessionId")),
    ("langfuse-input-deep-10k", "langfuse", json.dumps(lf_with()).replace('"content": "be brief"',
                                                                          f'"content": {deep_array()}').encode(),
     ("error", ANY, "not valid JSON")),
    ("langfuse-raw-nul", "langfuse", json.dumps(lf_with()).encode().replace(b'"be brief"', b'"be\x00brief"'),
     ("error", None, "unexpected control character in string")),
    # -- Langfuse SDK spans ------------------------------------------------------------------------------------
    ("langfuse-sdk-input-deep-10k", "langfuse-sdk", langfuse_span("bad1", "x", **{
        "langfuse.observation.input": deep_array()}), ("read", 1)),  # not JSON: the SDK's plain-string input
    ("langfuse-sdk-input-number", "langfuse-sdk", langfuse_span("bad1", "x", **{
        "langfuse.observation.input": {"intValue": "5"}}),
     ("error", "langfuse.observation.input", "must be a list of messages")),
    ("langfuse-sdk-no-trace-id", "langfuse-sdk", otlp({k: v for k, v in langfuse_span("bad1", "x")[
        "resourceSpans"][0]["scopeSpans"][0]["spans"][0].items() if k != "traceId"}),
     ("error", "traceId", "missing")),
    ("langfuse-sdk-lone-surrogate", "langfuse-sdk", langfuse_span_text('"generation"', '"gen\\udfffration"'),
     ("error", None, "invalid high surrogate in string")),
    # -- Phoenix spans -----------------------------------------------------------------------------------------
    ("phoenix-attributes-list", "phoenix", phoenix_with(attributes=[1, 2]),
     ("error", "attributes", "must be an object")),
    ("phoenix-start-time-number", "phoenix", phoenix_with(start_time=1767225601),
     ("error", "start_time", "must be an ISO 8601 time, got int")),
    ("phoenix-no-context", "phoenix", {k: v for k, v in phoenix_span("bad1", "x").items() if k != "context"},
     ("error", "context", "missing: a span needs")),
    ("phoenix-attributes-deep-900", "phoenix", phoenix_text('"attributes": {', '"attributes": {"deep": '
                                                            + '{"a": ' * 900 + "1" + "}" * 900 + ", "),
     ("read", 1)),
    ("phoenix-message-index-huge", "phoenix", phoenix_with(attributes={**phoenix_span("bad1", "x")["attributes"],
                                                                       "llm.input_messages.99999999999.message.role":
                                                                       "user"}),
     ("error", "llm.input_messages.2", "missing while llm.input_messages.99999999999 exists")),
    ("phoenix-invalid-utf8", "phoenix", json.dumps(phoenix_span("bad1", "x")).encode().replace(
        b'"llm"', b'"l\xfflm"', 1),
     ("error", None, "invalid UTF-8 at byte")),
    ("phoenix-messages-object", "phoenix", phoenix_with(attributes={**phoenix_span("bad1", "x")["attributes"],
                                                                    "llm.output_messages": {"0": 5}}),
     ("error", "llm.output_messages.0", "expected llm.output_messages.<index>.<attribute>")),
]


def compare(tmp_path, baseline: list, candidate: list, fmt: str | None = None, schema_dir=None):
    b = write_jsonl(tmp_path / "b.jsonl", baseline)
    c = write_jsonl(tmp_path / "c.jsonl", candidate)
    store = Store(tmp_path / "audit.duckdb")
    run_id, counts = compare_logs(store, b, c, CompareOptions(schema_dir=schema_dir, format=fmt))
    assert store.run_row(run_id)["status"] == "complete"
    for stats in (counts.baseline, counts.candidate):
        assert stats.records == stats.calls + stats.errors + stats.skipped
    return store, run_id, counts


@pytest.fixture
def deadline():
    """Asserts the case finished within DEADLINE_S (no sleeps: the clock is read once before and once after)."""
    start = time.monotonic()
    yield
    assert time.monotonic() - start <= DEADLINE_S, f"case took over {DEADLINE_S} s"


@pytest.mark.parametrize("case", RECORD_CASES, ids=[c[0] for c in RECORD_CASES])
def test_hostile_record_is_an_error_row_or_read_and_the_good_call_is_kept(tmp_path, deadline, case):
    _, key, bad, expected = case
    fmt = FORMAT.get(key, key)
    store, run_id, counts = compare(tmp_path, [GOOD[key]], [GOOD[key], bad], fmt)
    errors = store.rows("SELECT * FROM trace_errors WHERE run_id = ?", [run_id])
    assert counts.matched == 1, (counts, errors)
    if expected[0] == "read":
        assert errors == [] and counts.candidate.calls == 1 + expected[1], (counts, errors)
        return
    _, field, needle = expected
    assert counts.candidate.errors == 1 and len(errors) == 1, (counts, errors)
    (err,) = errors
    assert err["line"] == 2 and err["source"].endswith("c.jsonl"), err
    assert needle in err["message"], err["message"]
    if field is not ANY:
        assert err["field"] == field, err
    assert len(err["excerpt"]) <= 200


# -- hostile files -----------------------------------------------------------------------------------------------
BIG = 20_000_000  # a 20 MB line: the issue's 100 MB line would cost 100 MB of memory per side for no new path


@pytest.fixture(scope="module")
def huge_string() -> str:
    return "x" * BIG


def test_a_huge_attribute_value_is_read_whole(tmp_path, deadline, huge_string):
    """A 20 MB attribute (a giant system prompt) is kept, not cut or refused."""
    system = json.dumps([{"type": "text", "content": huge_string}])
    big = otlp(otel_span("big1", session="good", **{"gen_ai.system_instructions": system}))
    store, run_id, counts = compare(tmp_path, [big], [big])
    assert counts.matched == 1 and counts.candidate.errors == 0


def test_a_million_element_argument_array_is_read_whole(tmp_path, deadline):
    args = json.dumps({"ticket_id": 1, "tags": list(range(1_000_000))})
    rec = line(session="good", calls=[tool_call("close_ticket", args)])
    store, run_id, counts = compare(tmp_path, [rec], [GOOD["openai"]])
    assert counts.matched == 1 and counts.drifted == 1


@pytest.mark.parametrize("key", ["openai", "otel"])
def test_a_20mb_last_line_without_newline_is_read(tmp_path, deadline, huge_string, key):
    """The last line has no newline at EOF and is 20 MB long: read whole, the calls before it kept."""
    big = line(session="big", calls=[tool_call("close_ticket", {"ticket_id": 1})], content=huge_string) \
        if key == "openai" else otlp(otel_span("big1", session="big", content=huge_string))
    c = tmp_path / "c.jsonl"
    c.write_bytes(json.dumps(GOOD[key]).encode() + b"\n" + json.dumps(big).encode())
    b = write_jsonl(tmp_path / "b.jsonl", [GOOD[key]])
    store = Store(tmp_path / "audit.duckdb")
    run_id, counts = compare_logs(store, b, c, CompareOptions(schema_dir=None))
    assert counts.matched == 1 and counts.candidate.calls == 2 and counts.candidate.errors == 0


@pytest.mark.parametrize("key", ["openai", "responses", "otel", "phoenix", "langfuse"])
def test_bom_crlf_and_blank_lines_are_read(tmp_path, deadline, key):
    """A UTF-8 BOM at the start, CRLF line ends and blank lines (some only whitespace) lose nothing."""
    good = json.dumps(GOOD[key]).encode()
    c = tmp_path / "c.jsonl"
    c.write_bytes(b"\xef\xbb\xbf" + good + b"\r\n\r\n   \r\n" + good.replace(b'"good', b'"good2') + b"\r\n\n")
    b = write_jsonl(tmp_path / "b.jsonl", [GOOD[key]])
    store = Store(tmp_path / "audit.duckdb")
    run_id, counts = compare_logs(store, b, c, CompareOptions(schema_dir=None, format=FORMAT.get(key, key)))
    errors = store.rows("SELECT * FROM trace_errors WHERE run_id = ?", [run_id])
    assert errors == [] and counts.matched == 1 and counts.candidate.calls == 2, (counts, errors)
    assert counts.candidate.lines == 5 and counts.candidate.blank == 3


@pytest.mark.parametrize("kind", ["gzip", "binary"])
def test_a_gzip_or_binary_file_is_a_clear_file_error(tmp_path, deadline, kind):
    """Not a text file at all: the command stops naming the file and saying what it holds, not a crash."""
    payload = json.dumps(GOOD["openai"]).encode() + b"\n"
    c = tmp_path / "c.jsonl"
    c.write_bytes(gzip.compress(payload * 50) if kind == "gzip" else bytes(range(256)) * 400)
    b = write_jsonl(tmp_path / "b.jsonl", [GOOD["openai"]])
    with Store(tmp_path / "audit.duckdb") as store, pytest.raises(TraceError) as info:
        compare_logs(store, b, c, CompareOptions(schema_dir=None))
    message = str(info.value)
    assert message.startswith(f"{c}: no usable calls: every record failed") and "invalid UTF-8" in message, message
    assert ("this is gzip-compressed data; decompress the file first" in message) == (kind == "gzip"), message


def test_duplicate_span_ids_with_the_same_content_are_skipped_not_lost(tmp_path, deadline):
    store, run_id, counts = compare(tmp_path, [GOOD["otel"]], [GOOD["otel"], GOOD["otel"]])
    assert counts.matched == 1 and counts.candidate.skipped == 1 and counts.candidate.errors == 0


# -- hostile schemas ---------------------------------------------------------------------------------------------
def _line_with_tool(schema, arguments: dict, session: str = "s1") -> dict:
    tool = {"type": "function", "function": {"name": "hostile", "parameters": schema}}
    return line(session=session, calls=[tool_call("hostile", arguments)], tools=[tool, CLOSE_TOOL])


def _nested(keyword: str, depth: int) -> dict:
    schema: dict = {"type": "object", "properties": {"n": {"type": "integer"}}}
    for _ in range(depth):
        schema = {keyword: [schema]}
    return schema


RECURSIVE = {"type": "object", "properties": {"child": {"$ref": "#"}, "n": {"type": "integer"}}}
WIDE = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(10_000)},
        "required": [f"p{i}" for i in range(0, 10_000, 100)]}
HUGE_ENUM = {"type": "object", "properties": {"code": {"enum": [f"c{i}" for i in range(200_000)]}}}
LONG_PATTERN = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^" + "a" * 100_000 + "$"}}}
UNKNOWN_DRAFT = {"$schema": "http://example.com/draft-99/schema", "type": "object",
                 "properties": {"n": {"type": "integer"}}}
SCHEMA_CASES = [
    ("recursive-ref", RECURSIVE, {"child": {"child": {"n": 1}}, "n": 2}, {"child": {"child": {"n": "x"}}, "n": 2}),
    ("ten-thousand-properties", WIDE, {f"p{i}": i for i in range(0, 10_000, 100)},
     {f"p{i}": i for i in range(0, 9_900, 100)}),
    ("enormous-enum", HUGE_ENUM, {"code": "c199999"}, {"code": "nope"}),
    ("deep-allOf-50", _nested("allOf", 50), {"n": 1}, {"n": "x"}),
    ("deep-anyOf-50", _nested("anyOf", 50), {"n": 1}, {"n": "x"}),
    ("redos-pattern-short", {"type": "object", "properties": {"x": {"type": "string", "pattern": "^(a+)+$"}}},
     {"x": "a" * 40}, {"x": "a" * 40 + "!"}),
    ("unknown-draft", UNKNOWN_DRAFT, {"n": 1}, {"n": "x"}),
]


@pytest.mark.parametrize("case", SCHEMA_CASES, ids=[c[0] for c in SCHEMA_CASES])
def test_hostile_schema_validates_in_bounded_time(tmp_path, deadline, case):
    """The valid side validates, the invalid side is schema_broken: nothing hangs or is lost."""
    _, schema, good_args, bad_args = case
    store, run_id, counts = compare(tmp_path, [_line_with_tool(schema, good_args)],
                                    [_line_with_tool(schema, bad_args)])
    assert counts.matched == 1 and counts.drifted == 1, counts
    call = store.rows("SELECT baseline_valid, candidate_valid, drift_kind FROM calls WHERE run_id = ?", [run_id])
    assert [(c["baseline_valid"], c["candidate_valid"]) for c in call] == [(True, False)], call


CYCLE = {"$ref": "#/definitions/a", "definitions": {"a": {"$ref": "#/definitions/b"},
                                                    "b": {"$ref": "#/definitions/a"}}}
# (id, schema, words of the schema issue, its severity): the schema cannot judge, so validity is unknown on both
# sides, the issue is recorded and shown, and the arguments are still diffed
UNJUDGED_CASES = [
    ("ref-cycle", CYCLE, "a `$ref` cycle that never reaches a schema", "invalid"),
    ("self-ref", {"$ref": "#"}, "a `$ref` cycle that never reaches a schema", "invalid"),
    ("remote-ref", {"type": "object", "properties": {"x": {"$ref": "https://schemas.invalid/x.json"}}},
     "Unresolvable: https://schemas.invalid/x.json", "invalid"),
    ("ref-to-nowhere", {"type": "object", "properties": {"x": {"$ref": "#/definitions/none"}}}, "does not exist",
     "invalid"),
    ("100k-literal-pattern", LONG_PATTERN, "holds a literal run of 100000 characters", "invalid"),
    ("unclosed-pattern", {"type": "object", "properties": {"x": {"type": "string", "pattern": "(a"}}},
     "'(a' is not a 'regex'", "invalid"),
    ("deep-allOf-300", _nested("allOf", 300), "recursion limit", "invalid"),
    ("redos-pattern-long", {"type": "object", "properties": {"x": {"type": "string", "pattern": "^(a+)+$"}}},
     "did not finish within the 0.5 s validation budget", "timeout"),
    ("ten-thousand-properties-one-bad", {**WIDE, "properties": {**WIDE["properties"], "p7777": {"type": "integr"}}},
     "properties.p7777.type: 'integr' is not valid", "invalid"),
    ("invalid-keyword-value", {"type": "object", "properties": {"x": {"type": "integer", "minimum": "zero"}}},
     "is not of type 'number'", "invalid"),
]


@pytest.mark.parametrize("case", UNJUDGED_CASES, ids=[c[0] for c in UNJUDGED_CASES])
def test_a_schema_that_cannot_judge_is_a_schema_issue_and_the_call_is_still_diffed(tmp_path, deadline, case):
    _, schema, needle, severity = case
    args = {"x": "a" * 20_000 + "!"}, {"x": "a" * 20_001 + "!"}  # `regex` needs ~2 s for these: out of budget
    store, run_id, counts = compare(tmp_path, [_line_with_tool(schema, args[0])],
                                    [_line_with_tool(schema, args[1])])
    assert counts.matched == 1
    calls = store.rows("SELECT drift_kind, baseline_valid, candidate_valid FROM calls WHERE run_id = ?", [run_id])
    assert [(c["drift_kind"], c["baseline_valid"], c["candidate_valid"]) for c in calls] == [
        ("arguments_changed", None, None)]
    issues = store.rows("SELECT * FROM schema_issues WHERE run_id = ?", [run_id])
    assert [(i["tool_name"], i["severity"]) for i in issues] == [("hostile", severity)], issues
    assert needle in issues[0]["message"], issues[0]["message"]


@pytest.mark.parametrize("doc, kind", [(True, "all"), (False, "none"), ([1, 2], "list"), ("text", "string")],
                         ids=["schema-file-true", "schema-file-false", "schema-file-list", "schema-file-string"])
def test_a_schema_file_that_is_a_boolean_or_not_an_object(tmp_path, deadline, doc, kind):
    """`true`/`false` are JSON Schemas (everything / nothing is valid); a list or string is a clear error naming
    the file."""
    schemas = tmp_path / "schemas"
    schemas.mkdir()
    (schemas / "hostile.json").write_text(json.dumps(doc))
    lines = [_line_with_tool({"type": "object"}, {"x": 1})], [_line_with_tool({"type": "object"}, {"x": 2})]
    if kind in ("list", "string"):
        with pytest.raises(TraceError) as info:
            compare(tmp_path, *lines, schema_dir=schemas)
        assert str(schemas / "hostile.json") in str(info.value) and "JSON object" in str(info.value)
        return
    store, run_id, counts = compare(tmp_path, *lines, schema_dir=schemas)
    calls = store.rows("SELECT baseline_valid, candidate_valid FROM calls WHERE run_id = ?", [run_id])
    assert [(c["baseline_valid"], c["candidate_valid"]) for c in calls] == [(kind == "all", kind == "all")]


@pytest.mark.parametrize("parameters", [[1, 2], "object", 7], ids=["params-list", "params-string", "params-number"])
def test_request_parameters_that_are_not_an_object_are_a_schema_issue(tmp_path, deadline, parameters):
    store, run_id, counts = compare(tmp_path, [_line_with_tool(parameters, {"x": 1})],
                                    [_line_with_tool(parameters, {"x": 2})])
    assert counts.matched == 1
    issues = store.rows("SELECT message FROM schema_issues WHERE run_id = ?", [run_id])
    assert any("parameters is not an object" in i["message"] for i in issues), issues


def test_a_ref_cycle_is_a_schema_issue_shown_by_compare_and_the_call_is_still_diffed(tmp_path, deadline):
    """`a -> b -> a` never reaches a schema: compare's summary names the tool and the cycle (it used to be
    swallowed, leaving validity unknown with nothing said)."""
    b = write_jsonl(tmp_path / "b.jsonl", [_line_with_tool(CYCLE, {"x": 1})])
    c = write_jsonl(tmp_path / "c.jsonl", [_line_with_tool(CYCLE, {"x": 2})])
    db = tmp_path / "audit.duckdb"
    result = CliRunner().invoke(cli, ["compare", str(b), str(c), "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert "schema issues         1 (validity unknown for the calls they cover)" in result.output, result.output
    assert "hostile (request): invalid: schema cannot be applied: it recurses past Python's recursion limit (a " \
           "`$ref` cycle" in result.output, result.output
    assert "arguments_changed=1" in result.output


def test_a_pretty_printed_export_with_a_bom_is_read(tmp_path, deadline):
    """`json.dump(..., indent=2)` saved by a Windows editor: the BOM before the lone `{` loses nothing."""
    c = tmp_path / "c.json"
    c.write_bytes(b"\xef\xbb\xbf" + json.dumps(GOOD["otel"], indent=2).encode() + b"\r\n")
    b = write_jsonl(tmp_path / "b.jsonl", [GOOD["otel"]])
    store = Store(tmp_path / "audit.duckdb")
    run_id, counts = compare_logs(store, b, c, CompareOptions(schema_dir=None))
    assert counts.formats["candidate"] == "otel" and counts.matched == 1 and counts.candidate.errors == 0, counts


def test_more_than_three_schema_issues_end_with_the_query_for_all(tmp_path, deadline):
    tools = [{"type": "function", "function": {"name": f"loop{i}", "parameters": CYCLE}} for i in range(4)]
    calls = [tool_call(f"loop{i}", {"x": 1}, f"call_{i}") for i in range(4)]
    rec = line(session="s1", calls=calls, tools=tools)
    b, c = write_jsonl(tmp_path / "b.jsonl", [rec]), write_jsonl(tmp_path / "c.jsonl", [rec])
    db = tmp_path / "audit.duckdb"
    result = CliRunner().invoke(cli, ["compare", str(b), str(c), "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert "schema issues         4" in result.output and "    loop2 (request): invalid:" in result.output
    assert "loop3 (request)" not in result.output
    assert ('... 1 more: toolaudit sql "SELECT tool_name, schema_source, severity, message FROM schema_issues '
            f'WHERE run_id = 1 ORDER BY tool_name, severity" --db {db}') in result.output, result.output
