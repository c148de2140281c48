"""Other trace formats (OTel GenAI, OpenInference, Langfuse, Responses API) read into the same calls as OpenAI
logs: the example canary rewritten in each shape finds exactly the drifts the OpenAI logs find, and the
readers' details (attribute forms, ordering, sessions, detection, import, replay) hold on small files."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner
from conftest import REPO, write_jsonl
from format_records import (
    generation,
    lf_trace,
    oi_span,
    otel_attrs,
    otel_span,
    otlp,
    responses_record,
    span,
    value,
)

from toolaudit.cli import cli
from toolaudit.compare.logs import CompareOptions, compare_logs
from toolaudit.engines import Engine, EngineResult
from toolaudit.ingest.registry import detect_format
from toolaudit.ingest.traces import TraceCall, TraceLineError, TraceStats, read_trace, use_format
from toolaudit.store import Store

SHAPES = ["otel", "openinference", "langfuse", "responses"]
# OpenInference spans record no finish reason, nor does a Langfuse observation whose output is the assistant message
# alone (the fixtures' cut answer is one): there an answer cut at max_tokens cannot be told from a broken one, and
# is compared (an unparseable drift) where the other shapes store it as truncated.
FINISH_REASON_LOST = {"openinference", "langfuse"}


def tables(store: Store, run_id: int) -> dict:
    """What a comparison concluded, without what depends on the file layout (sources, lines, raw text)."""
    return {
        "calls": sorted(store.query("""SELECT session_id, call_index, customer, tool_name, match_status, drift_kind,
            baseline_valid, candidate_valid, arg_diff_count FROM calls WHERE run_id = ?""", [run_id])[1], key=str),
        "arg_diffs": sorted(store.query("""SELECT session_id, call_index, call_position, tool_name, arg_path,
            diff_kind, baseline_value, candidate_value FROM arg_diffs WHERE run_id = ?""", [run_id])[1], key=str),
        "outputs": sorted(store.query("""SELECT session_id, call_index, side, parse_status, tool_calls, schema_errors
            FROM outputs WHERE run_id = ?""", [run_id])[1], key=str),
    }


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    out = tmp_path_factory.mktemp("formats")
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_format_fixtures.py"), "--out-dir", str(out)],
                   check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def openai_result(tmp_path_factory):
    with Store(tmp_path_factory.mktemp("openai") / "a.duckdb") as store:
        run_id, counts = compare_logs(store, REPO / "traces/example_baseline.jsonl",
                                      REPO / "traces/example_candidate.jsonl", CompareOptions(schema_dir=None))
        return tables(store, run_id), counts


@pytest.mark.parametrize("shape", SHAPES)
def test_each_shape_finds_exactly_the_drifts_of_the_openai_logs(shape, fixtures, openai_result, tmp_path):
    want, want_counts = openai_result
    b, c = fixtures / f"{shape}_baseline.jsonl", fixtures / f"{shape}_candidate.jsonl"
    expected = json.loads((REPO / "traces/example_expected.json").read_text())
    truncated = {(t["session_id"], t["call_index"]) for t in expected["truncated"]}
    with Store(tmp_path / "f.duckdb") as store:
        run_id, counts = compare_logs(store, b, c, CompareOptions(schema_dir=None))
        got = tables(store, run_id)
        if shape in FINISH_REASON_LOST:
            assert [r[4:6] for r in got["calls"] if r[:2] in truncated] == [("matched", "unparseable")]
            assert [r[4:6] for r in want["calls"] if r[:2] in truncated] == [("truncated", None)]
            got["calls"], want = [r for r in got["calls"] if r[:2] not in truncated], {
                **want, "calls": [r for r in want["calls"] if r[:2] not in truncated]}
        assert got["calls"] == want["calls"]
        assert got["arg_diffs"] == want["arg_diffs"]
        assert got["outputs"] == want["outputs"]
        assert store.query("SELECT count(*) FROM trace_errors WHERE run_id = ?", [run_id])[1][0][0] == 0
        sources = {r[0] for r in store.query("SELECT DISTINCT source FROM outputs WHERE run_id = ?", [run_id])[1]}
        assert sources == {str(b), str(c)}  # rows name the user's files, not the converted copies
        max_line = store.query("SELECT max(line) FROM outputs WHERE run_id = ? AND side = 'baseline'", [run_id])[1]
        assert max_line[0][0] <= len(b.read_text().splitlines())
    assert counts.formats == {"baseline": shape, "candidate": shape}
    for side in ("baseline", "candidate"):
        stats = getattr(counts, side)
        assert stats.records == stats.calls + stats.errors + stats.skipped  # every record accounted for
        assert stats.lines == stats.blank + len([x for x in (fixtures / f"{shape}_{side}.jsonl").read_text()
                                                 .splitlines() if x.strip()])
        assert stats.calls == getattr(want_counts, side).calls and stats.errors == 0
        assert (stats.skipped > 0) == (shape != "responses")
    drifted = {(r[0], r[1]): r[5] for r in got["calls"] if r[5] not in (None, "identical", "text_only")}
    assert drifted == {(d["session_id"], d["call_index"]): d["kind"] for d in expected["drifts"]}


def test_fixture_script_is_deterministic(tmp_path):
    for name in ("one", "two"):
        subprocess.run([sys.executable, str(REPO / "scripts" / "make_format_fixtures.py"), "--out-dir",
                        str(tmp_path / name), "--sessions", "4"], check=True, capture_output=True)
    for path in (tmp_path / "one").iterdir():
        assert path.read_bytes() == (tmp_path / "two" / path.name).read_bytes(), path.name


def test_formats_are_detected_from_the_first_record(fixtures, tmp_path):
    for shape in SHAPES:
        assert detect_format(str(fixtures / f"{shape}_baseline.jsonl"))[0] == shape
    assert detect_format(str(REPO / "traces/example_baseline.jsonl"))[0] == "openai"
    # garbage first, then an OTLP export that only holds an HTTP span, then the GenAI one: otel from line 3
    path = write_jsonl(tmp_path / "x.jsonl", [b"\x00\x01 not json", otlp(span("h1", {"http.method": "GET"})),
                                              otlp(otel_span())])
    assert detect_format(str(path)) == ("otel", 3)
    assert detect_format(str(write_jsonl(tmp_path / "b.bin", [b"\xff\xfe\x00garbage"]))) == ("openai", None)


def read_all(path, **kw) -> tuple[list[TraceCall], list[TraceLineError], TraceStats]:
    stats = TraceStats()
    items = list(read_trace(path, require_response=False, stats=stats, **kw))
    return ([i for i in items if isinstance(i, TraceCall)], [i for i in items if isinstance(i, TraceLineError)],
            stats)


def test_otel_call_order_comes_from_start_time_not_file_order(tmp_path):
    late = otel_span("a2", start=20, end=21, calls=[("close_ticket", {"ticket_id": 2})])
    early = otel_span("a1", start=10, end=11, calls=[("close_ticket", {"ticket_id": 1})])
    path = write_jsonl(tmp_path / "o.jsonl", [otlp(late), otlp(early)])
    calls, errors, stats = read_all(path)
    assert errors == [] and [(c.call_index, c.line, c.record) for c in calls] == [(0, 2, "a1"), (1, 1, "a2")]
    first = calls[0]
    assert first.source == str(path) and first.session_id == "s1" and first.customer == "acme"
    assert first.request["messages"] == [{"role": "system", "content": "be brief"},
                                         {"role": "user", "content": "close ticket 1"}]
    assert first.request["tools"][0]["function"]["name"] == "search_tickets"
    message = first.response_message
    assert message["tool_calls"][0]["function"] == {"name": "close_ticket", "arguments": '{"ticket_id":1}'}
    assert first.response["choices"][0]["finish_reason"] == "tool_calls"


def test_otel_attribute_value_forms_and_resource_attributes(tmp_path):
    attrs = otel_attrs(session=None, customer=None)
    attrs["gen_ai.output.messages"] = [{"role": "assistant", "finish_reason": "stop", "parts": [
        {"type": "tool_call", "id": "c1", "name": "search_tickets",
         "arguments": {"query": "x", "limit": 3, "ratio": 0.5, "strict": True, "tags": ["a", "b"]}}]}]
    attrs["gen_ai.request.temperature"] = {"doubleValue": "0.25"}  # OTLP/JSON may write doubles as strings
    attrs["gen_ai.usage.input_tokens"] = {"intValue": 12}  # ... and ints as numbers
    path = write_jsonl(tmp_path / "o.jsonl", [otlp(span("a1", attrs), resource={"tenant": "globex",
                                                                                 "conversation": "conv-9"})])
    calls, errors, _ = read_all(path, session_key="conversation", customer_key="tenant")
    assert errors == []
    (call,) = calls
    assert (call.session_id, call.customer) == ("conv-9", "globex")
    assert call.request["temperature"] == 0.25 and call.response["usage"]["prompt_tokens"] == 12
    args = json.loads(call.response_message["tool_calls"][0]["function"]["arguments"])
    assert args == {"query": "x", "limit": 3, "ratio": 0.5, "strict": True, "tags": ["a", "b"]}


def test_otel_session_falls_back_to_the_trace_id(tmp_path):
    path = write_jsonl(tmp_path / "o.jsonl", [otlp(otel_span(session=None, trace_id="ab" * 16))])
    calls, errors, _ = read_all(path)
    assert errors == [] and calls[0].session_id == "ab" * 16


def test_otel_older_event_form(tmp_path):
    events = [{"timeUnixNano": "3", "name": "gen_ai.user.message", "attributes": [
                  {"key": "content", "value": value("close ticket 1")}]},
              {"timeUnixNano": "1", "name": "gen_ai.system.message", "attributes": [
                  {"key": "content", "value": value("be brief")}]},
              {"timeUnixNano": "9", "name": "gen_ai.choice", "attributes": [
                  {"key": "index", "value": value(0)}, {"key": "finish_reason", "value": value("tool_calls")},
                  {"key": "message", "value": value({"role": "assistant", "tool_calls": [
                      {"id": "c1", "type": "function",
                       "function": {"name": "close_ticket", "arguments": '{"ticket_id": 1}'}}]})}]}]
    attrs = {"gen_ai.operation.name": "chat", "gen_ai.conversation.id": "s1"}
    calls, errors, _ = read_all(write_jsonl(tmp_path / "o.jsonl", [otlp(span("a1", attrs, events=events))]))
    assert errors == []
    assert [m["role"] for m in calls[0].request["messages"]] == ["system", "user"]
    assert calls[0].response_message["tool_calls"][0]["function"]["arguments"] == '{"ticket_id": 1}'


def test_openinference_contents_items_and_invocation_parameters(tmp_path):
    sp = oi_span(**{"llm.input_messages.1.message.content": None,
                    "llm.input_messages.1.message.contents.0.message_content.type": "text",
                    "llm.input_messages.1.message.contents.0.message_content.text": "close ",
                    "llm.input_messages.1.message.contents.1.message_content.text": "ticket 1"})
    calls, errors, _ = read_all(write_jsonl(tmp_path / "o.jsonl", [otlp(sp)]))
    assert errors == []
    (call,) = calls
    assert call.request["messages"][1]["content"] == [{"type": "text", "text": "close "},
                                                      {"type": "text", "text": "ticket 1"}]
    assert call.request["temperature"] == 0 and call.customer == "acme" and call.record == "b1"


def test_langfuse_trace_lines_join_observation_lines(tmp_path):
    trace = lf_trace(observations=["g1"])
    path = write_jsonl(tmp_path / "l.jsonl", [generation(), trace,
                                              {"id": "e1", "traceId": "tr1", "type": "EVENT", "startTime": "x"}])
    calls, errors, stats = read_all(path)
    assert errors == [] and (stats.calls, stats.skipped, stats.records) == (1, 1, 2)
    assert (calls[0].session_id, calls[0].customer, calls[0].line) == ("s1", "acme", 1)
    assert calls[0].request["temperature"] == 0  # "0" from modelParameters, as a number


def test_responses_items_become_chat_messages(tmp_path):
    rec = responses_record()
    rec["request"]["input"] = [
        {"role": "user", "content": [{"type": "input_text", "text": "close ticket 1"}]},
        {"type": "function_call", "call_id": "c0", "name": "search_tickets", "arguments": '{"query": "1"}'},
        {"type": "function_call_output", "call_id": "c0", "output": "[1]"},
        {"type": "reasoning", "summary": []}]
    calls, errors, _ = read_all(write_jsonl(tmp_path / "r.jsonl", [rec]))
    assert errors == []
    roles = [(m["role"], m.get("tool_call_id")) for m in calls[0].request["messages"]]
    assert roles == [("system", None), ("user", None), ("assistant", None), ("tool", "c0")]
    assert calls[0].request["tools"][1]["function"]["name"] == "close_ticket"


def test_import_writes_an_openai_log_that_compares_the_same(fixtures, openai_result, tmp_path):
    runner = CliRunner()
    for side in ("baseline", "candidate"):
        result = runner.invoke(cli, ["import", str(fixtures / f"otel_{side}.jsonl"), "-o",
                                     str(tmp_path / f"{side}.jsonl")])
        assert result.exit_code == 0, result.output
        assert "otel, detected" in result.output and "skipped" in result.output
    first = json.loads((tmp_path / "baseline.jsonl").read_text().splitlines()[0])
    assert set(first) == {"request", "response"} and first["request"]["metadata"]["source_record"]
    with Store(tmp_path / "i.duckdb") as store:
        run_id, _ = compare_logs(store, tmp_path / "baseline.jsonl", tmp_path / "candidate.jsonl",
                                 CompareOptions(schema_dir=None))
        assert tables(store, run_id)["calls"] == openai_result[0]["calls"]


def test_import_to_stdout_and_forced_format(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", [responses_record()])
    result = CliRunner().invoke(cli, ["import", str(path), "--format", "responses", "-o", "-"])
    assert result.exit_code == 0, result.output
    line = json.loads(result.output.splitlines()[0])
    assert line["response"]["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "close_ticket"
    assert "(responses, as asked)" in result.output


def test_replay_reads_other_formats_and_honours_use_format(tmp_path):
    path = write_jsonl(tmp_path / "o.jsonl", [otlp(otel_span())])
    calls, _, _ = read_all(path)
    assert calls[0].source == str(path) and calls[0].line == 1
    with use_format("openai"):  # forced: the OTLP line is then an error row explaining itself
        stats = TraceStats()
        with pytest.raises(Exception, match="no usable calls"):
            list(read_trace(path, stats=stats))
    assert stats.errors == 1


def test_compare_cli_takes_format_and_prints_skipped_records(fixtures, tmp_path):
    db = tmp_path / "c.duckdb"
    result = CliRunner().invoke(cli, ["compare", str(fixtures / "openinference_baseline.jsonl"),
                                      str(fixtures / "openinference_candidate.jsonl"), "--db", str(db),
                                      "--format", "openinference", "--schemas", str(tmp_path / "none")])
    assert result.exit_code == 0, result.output
    assert "skipped (baseline)" in result.output and "openinference.span.kind 'CHAIN'" in result.output
    summary = CliRunner().invoke(cli, ["summary", "--db", str(db), "--json"])
    data = json.loads(summary.output)
    assert data["skipped"]["candidate"]["count"] > 0 and data["counts"]["formats"]["baseline"] == "openinference"


class _EchoEngine(Engine):
    """A stand-in for the built-in paths' torch engine that answers every request with one fixed tool call (no
    model needed)."""

    name = "torch"

    def generate(self, requests):
        return [EngineResult(key=r.key, message={"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "close_ticket", "arguments": '{"ticket_id": 1}'}}]},
            completion_tokens=3) for r in requests]

    def path_components(self):
        return {"echo": True, "path": self.path.name}


def test_replay_takes_span_files_and_names_their_bad_spans(tmp_path, db_path):
    from toolaudit.replay.replayer import ReplayOptions, replay_traces

    path = write_jsonl(tmp_path / "spans.jsonl", [
        otlp(otel_span("a2", start=20, end=21), span("h1", {"http.request.method": "GET"})),
        otlp(otel_span("a1", start=10, end=11), otel_span("a3", start=30, end=None))])
    with Store(db_path) as store:
        run_id, counts = replay_traces(store, ReplayOptions(traces=[str(path)], schema_dir=None),
                                       engine_factory=_EchoEngine)
        calls = store.query("SELECT session_id, call_index, drift_kind FROM calls ORDER BY call_index")[1]
        (err,) = store.rows("SELECT * FROM trace_errors WHERE run_id = ?", [run_id])
        stored = json.loads(store.run_row(run_id)["counts"])
    assert calls == [("s1", 0, "identical"), ("s1", 1, "identical")]
    assert (err["side"], err["source"], err["line"], err["field"]) == ("input", str(path), 2, "endTimeUnixNano")
    assert err["message"].startswith("span a3: missing")
    assert counts.traces[str(path)] == {"lines": 2, "blank": 0, "calls": 2, "errors": 1, "skipped": 1, "records": 4}
    assert stored["baseline"]["skipped"] == 1


def test_an_export_scanned_in_parallel_ranges_settles_to_what_one_range_gives(fixtures, tmp_path, monkeypatch):
    """Spans exported twice across ranges, sessions spread over ranges, bad spans: the same rows either way."""
    import toolaudit.compare.logs as compare
    import toolaudit.ingest.sources as sources

    lines = (fixtures / "otel_candidate.jsonl").read_text().splitlines()
    first = json.loads(lines[0])["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    conflicting = {**first, "name": "renamed"}  # same ids, other content: an error where it comes again
    extra = [otlp(conflicting), otlp(otel_span("late", session="s-late", end=None)),
             otlp(otel_span("x9", start=7, end=8))]
    path = write_jsonl(tmp_path / "spans.jsonl", [*lines, *extra])

    def stored(name: str, **options) -> tuple[dict, dict]:
        with Store(tmp_path / f"{name}.duckdb") as store:
            _, counts = compare_logs(store, fixtures / "otel_baseline.jsonl", path,
                                     CompareOptions(schema_dir=None, **options))
            rows = {t: store.query(f"SELECT * EXCLUDE (run_id) FROM {t} ORDER BY ALL")[1]
                    for t in ("calls", "outputs", "arg_diffs", "trace_errors")}
        return rows, counts.as_dict()

    whole, whole_counts = stored("whole", workers=1)
    monkeypatch.setattr(sources, "SMALL", 0)
    monkeypatch.setattr(compare, "CHUNK_BYTES", 64 << 10)
    assert len(sources.line_ranges(str(path), 12, 64 << 10)) > 10
    parts, parts_counts = stored("parts", workers=3)
    assert parts == whole and parts_counts == whole_counts
    assert whole_counts["skipped_reasons"]["candidate"]["duplicate export of a span"] > 0
    errors = [(e[2], e[3]) for e in whole["trace_errors"]]  # (line, field)
    assert errors == [(len(lines) + 1, "spanId"), (len(lines) + 2, "endTimeUnixNano")]
    calls, _, _ = read_all(path)
    assert [(c.session_id, c.call_index, c.line) for c in calls if c.record == "x9"] == [("s1", 0, len(lines) + 3)]


def test_customer_and_session_keys_look_inside_json_string_attributes(tmp_path):
    """OpenInference's `using_metadata` writes `metadata` as a JSON string: `metadata.customer` is found in it,
    as a session nested the same way; a key that names nothing leaves the customer unset."""
    metadata = json.dumps({"customer": "globex", "conversation": {"id": "conv-7"}})
    path = tmp_path / "oi.json"
    path.write_text(json.dumps(otlp(oi_span("b1", customer=None, metadata=metadata))))
    calls, errors, _ = read_all(path, customer_key="metadata.customer", session_key="metadata.conversation.id")
    assert not errors and [(c.customer, c.session_id) for c in calls] == [("globex", "conv-7")]
    calls, _, _ = read_all(path, customer_key="metadata.tenant")
    assert [c.customer for c in calls] == [None]
