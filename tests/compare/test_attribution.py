"""Only the candidate's doing counts as drift: pairs of different requests are mismatched (never drift), answers cut
at max_tokens are truncated (not compared), and logs without a usable session key pair by request digest.

Every case writes real JSONL logs and a real DuckDB file, and checks the figure a team would act on."""

from __future__ import annotations

import copy
import json

from click.testing import CliRunner
from conftest import CLOSE_TOOL, SEARCH_TOOL, tool_call, write_jsonl

from toolaudit.analysis.figures import run_summary
from toolaudit.cli import cli
from toolaudit.compare.logs import CompareOptions, compare_logs
from toolaudit.compare.pairs import Analyzer
from toolaudit.compare.request_digest import describe_difference, digest_hex
from toolaudit.engines import EngineResult
from toolaudit.engines.paths import PathConfig
from toolaudit.replay.evidence import side_output
from toolaudit.store import RowBuffer, Store
from toolaudit.validate.schemas import SchemaRegistry

INVOICE_TOOL = {"type": "function", "function": {
    "name": "retrieve_invoice", "description": "Fetch one invoice.",
    "parameters": {"type": "object", "properties": {"invoice_id": {"type": "string"}}, "required": ["invoice_id"]}}}
TOOLS = [SEARCH_TOOL, CLOSE_TOOL, INVOICE_TOOL]


def record(session: str | None, index: int | None, ask: str, name: str, args: dict, finish: str = "tool_calls",
           history: list | None = None) -> dict:
    """One log line: the user's ask (after `history`) and the recorded answer; no metadata when `session` is None,
    no explicit call index when `index` is None."""
    request = {"model": "m", "messages": [{"role": "system", "content": "You are a support agent."},
                                          *(history or []), {"role": "user", "content": ask}], "tools": TOOLS}
    if session is not None:
        request["metadata"] = {"session_id": session, "customer": "acme"}
        if index is not None:
            request["metadata"]["call_index"] = index
    message = {"role": "assistant", "content": None, "tool_calls": [tool_call(name, args, f"call_{session}_{index}")]}
    return {"request": request, "response": {"id": "r", "object": "chat.completion", "model": "m",
                                             "choices": [{"index": 0, "message": message, "finish_reason": finish}]}}


def traffic(sessions: int = 10, calls: int = 5, with_keys: bool = True, indices: bool = True) -> list[dict]:
    """`sessions` x `calls` distinct requests: searches, with an invoice lookup as each session's third call."""
    out = []
    for s in range(sessions):
        for i in range(calls):
            session, index = (f"s{s}" if with_keys else None), (i if indices else None)
            if i == 2:
                out.append(record(session, index, f"show invoice INV-{s}", "retrieve_invoice",
                                  {"invoice_id": f"INV-{s}"}))
            else:
                out.append(record(session, index, f"find tickets about topic {s}-{i}", "search_tickets",
                                  {"query": f"topic {s}-{i}", "limit": 10}))
    return out


def with_drift(lines: list[dict], at: int) -> list[dict]:
    """A copy in which line `at` answers with another limit: one real drift (arguments_changed)."""
    out = copy.deepcopy(lines)
    fn = out[at]["response"]["choices"][0]["message"]["tool_calls"][0]["function"]
    args = json.loads(fn["arguments"])
    args["limit"] = 99
    fn["arguments"] = json.dumps(args)
    return out


def compare(tmp_path, baseline: list, candidate: list, **options):
    b, c = write_jsonl(tmp_path / "b.jsonl", baseline), write_jsonl(tmp_path / "c.jsonl", candidate)
    store = Store(tmp_path / "audit.duckdb")
    run_id, counts = compare_logs(store, b, c, CompareOptions(schema_dir=None, **options))
    return store, run_id, counts


def statuses(store: Store, run_id: int) -> dict[str, int]:
    return dict(store.query("SELECT match_status, count(*) FROM calls WHERE run_id = ? GROUP BY 1", [run_id])[1])


# -- pairs verified -------------------------------------------------------------------------------------------

def swapped_logs() -> tuple[list[dict], list[dict]]:
    """50 calls; the candidate drifts on one (s0 call 1) and holds two calls whose session metadata are swapped:
    s3 call 0's answer (a search) is recorded under s7 call 2's key (an invoice lookup), and the other way round."""
    baseline = traffic()
    candidate = with_drift(baseline, 1)
    a, b = 15, 37  # s3 call 0, s7 call 2
    meta_a, meta_b = (copy.deepcopy(candidate[k]["request"]["metadata"]) for k in (a, b))
    candidate[a]["request"]["metadata"], candidate[b]["request"]["metadata"] = meta_b, meta_a
    return baseline, candidate


def test_swapped_session_metadata_are_mismatches_and_the_true_drift_is_reported(tmp_path):
    baseline, candidate = swapped_logs()
    store, run_id, counts = compare(tmp_path, baseline, candidate)
    assert (counts.matched, counts.mismatched, counts.drifted) == (48, 2, 1)
    assert counts.kinds.get("arguments_changed") == 1 and "tool_name_changed" not in counts.kinds
    rows = {(r["session_id"], r["call_index"]): r for r in store.rows(
        "SELECT * FROM calls WHERE run_id = ? AND match_status <> 'matched'", [run_id])}
    assert set(rows) == {("s3", 0), ("s7", 2)}
    assert all(r["match_status"] == "mismatched" and r["drift_kind"] is None and not r["drifted"]
               for r in rows.values())
    assert rows[("s3", 0)]["detail"] == ("different requests: messages differ from message 1 (user): "
                                         "'find tickets about topic 3-0' vs 'show invoice INV-7'")
    summary = run_summary(store, run_id)
    assert (summary["calls"], summary["drifted_calls"]) == (48, 1)  # 2.08%, not 3 of 50
    assert summary["not_compared"] == {"truncated": 0, "mismatched": 2}
    digests = store.rows("SELECT side, request_digest FROM outputs WHERE run_id = ? AND session_id = 's3' "
                         "AND call_index = 0 ORDER BY side", [run_id])
    assert digests[0]["request_digest"] == digest_hex(baseline[15]["request"]) != digests[1]["request_digest"]
    assert [m["session_id"] for m in counts.mismatches] == ["s3", "s7"]


def test_compare_exits_1_on_mismatches_above_the_threshold_and_names_them(tmp_path):
    baseline, candidate = swapped_logs()
    b, c = write_jsonl(tmp_path / "b.jsonl", baseline), write_jsonl(tmp_path / "c.jsonl", candidate)
    db = str(tmp_path / "audit.duckdb")
    result = CliRunner().invoke(cli, ["compare", str(b), str(c), "--db", db, "--schemas", str(tmp_path)])
    assert result.exit_code == 1
    assert "2 of 50 paired calls (4.00%, over --max-mismatched 0%) answer different requests" in result.output
    assert ("session 's3' call 0 (baseline line 16, candidate line 38): messages differ from message 1 (user): "
            "'find tickets about topic 3-0' vs 'show invoice INV-7'; session 's7' call 2" in result.output)
    assert "mismatched calls      2 (different requests, not compared)" in result.output
    assert "drifted calls         1 of 48 compared (2.08%" in result.output
    ok = CliRunner().invoke(cli, ["compare", str(b), str(c), "--db", db, "--schemas", str(tmp_path),
                                  "--max-mismatched", "5%"])
    assert ok.exit_code == 0, ok.output


def test_logs_without_session_keys_pair_by_request(tmp_path):
    """No metadata at all, the candidate in another line order: pairing by (request digest, occurrence) finds
    every call's own answer, so the figure is the true one (1 of 20), with no mismatch."""
    baseline = traffic(sessions=4, with_keys=False)
    baseline.append(copy.deepcopy(baseline[0]))  # the same request twice: paired by occurrence
    candidate = with_drift(baseline, 3)
    candidate = candidate[::-1]
    store, run_id, counts = compare(tmp_path, baseline, candidate)
    assert counts.pairing["by"] == "request" and "no baseline call carries a session" in counts.pairing["reason"]
    assert (counts.matched, counts.mismatched, counts.drifted, counts.baseline.errors) == (21, 0, 1, 0)
    drifted = store.rows("SELECT session_id, call_index FROM calls WHERE run_id = ? AND drifted", [run_id])
    assert drifted == [{"session_id": "request-" + digest_hex(baseline[3]["request"])[:20], "call_index": 0}]
    repeated = store.query("SELECT call_index FROM calls WHERE run_id = ? AND session_id = ? ORDER BY 1",
                           [run_id, "request-" + digest_hex(baseline[0]["request"])[:20]])[1]
    assert repeated == [(0,), (1,)]


def test_a_session_key_every_line_shares_pairs_by_request_not_line_order(tmp_path):
    """--session-key request.model: one session, indices by line order. The candidate log holds the same calls in
    another order, so line order pairs different requests; auto pairing pairs by request: the true 1 in 50."""
    baseline = traffic(indices=False)
    candidate = with_drift(baseline, 1)
    candidate = candidate[25:] + candidate[:25]
    store, run_id, counts = compare(tmp_path, baseline, candidate, session_key="request.model")
    assert counts.pairing == {"by": "request", "reason": "every baseline call shares one session at request.model, "
                                                         "and pairing by it put 50 different requests together"}
    assert (counts.matched, counts.mismatched, counts.drifted) == (50, 0, 1)
    store.close()
    forced = compare(tmp_path, baseline, candidate, session_key="request.model", pair_by="session")[2]
    assert (forced.matched, forced.mismatched, forced.drifted) == (0, 50, 0)  # never drift, all mismatched


def test_pairing_by_session_makes_calls_without_a_session_error_rows(tmp_path):
    baseline = traffic(sessions=2, with_keys=False)
    store, run_id, counts = compare(tmp_path, baseline + traffic(sessions=1), baseline + traffic(sessions=1),
                                    pair_by="session")
    errors = store.rows("SELECT line, field, message FROM trace_errors WHERE run_id = ? AND side = 'baseline' "
                        "ORDER BY line", [run_id])
    assert [e["line"] for e in errors] == list(range(1, 11))
    assert errors[0]["field"] == "request.metadata.session_id" and "--pair-by request" in errors[0]["message"]
    assert (counts.baseline.calls, counts.baseline.errors, counts.matched) == (5, 10, 5)


# -- truncation -------------------------------------------------------------------------------------------------

def cut(lines: list[dict], at: int) -> list[dict]:
    """A copy in which line `at` stopped at max_tokens: a half-written answer, finish_reason length."""
    out = copy.deepcopy(lines)
    choice = out[at]["response"]["choices"][0]
    fn = choice["message"].pop("tool_calls")[0]["function"]
    choice["message"]["content"] = '<tool_call>{"name": "%s", "arguments": {"qu' % fn["name"]
    choice["finish_reason"] = "length"
    return out


def test_truncated_answers_are_counted_apart_not_as_drift(tmp_path):
    baseline = traffic(sessions=4)
    baseline_cut, candidate = cut(baseline, 4), cut(with_drift(baseline, 0), 4)  # both cut at line 5
    candidate = cut(candidate, 9)  # the candidate alone cut at line 10
    store, run_id, counts = compare(tmp_path, baseline_cut, candidate)
    assert (counts.matched, counts.truncated, counts.drifted) == (18, 2, 1)
    rows = {r["call_index"] + 5 * int(r["session_id"][1:]): r for r in store.rows(
        "SELECT * FROM calls WHERE run_id = ? AND match_status = 'truncated'", [run_id])}
    assert rows[4]["detail"] == "both outputs stopped at max_tokens (finish_reason 'length')"
    assert rows[9]["detail"] == ("candidate output stopped at max_tokens (finish_reason 'length'); baseline "
                                 "finished: tool_calls")
    assert all(r["drift_kind"] is None and r["drifted"] is None for r in rows.values())
    finish = store.query("SELECT side, finish_reason FROM outputs WHERE run_id = ? AND session_id = 's1' AND "
                         "call_index = 4 ORDER BY side", [run_id])[1]
    assert finish == [("baseline", "tool_calls"), ("candidate", "length")]
    summary = run_summary(store, run_id)
    assert (summary["calls"], summary["drifted_calls"], summary["not_compared"]["truncated"]) == (18, 1, 2)
    customer = store.rows("SELECT calls, drifted_calls FROM customer_drift WHERE run_id = ?", [run_id])
    assert customer == [{"calls": 18, "drifted_calls": 1}]  # the views leave them out too


def test_summary_shows_truncated_calls_with_the_hint(tmp_path):
    baseline = traffic(sessions=2)
    b = write_jsonl(tmp_path / "b.jsonl", cut(baseline, 0))
    c = write_jsonl(tmp_path / "c.jsonl", cut(baseline, 0))
    result = CliRunner().invoke(cli, ["compare", str(b), str(c), "--db", str(tmp_path / "a.duckdb")])
    assert result.exit_code == 0, result.output
    assert "truncated calls       1 (stopped at max_tokens, not compared)" in result.output
    assert "raise max_tokens if the answers need the room" in result.output and " of 9 compared (" in \
        result.output


def test_a_replayed_pair_cut_at_max_tokens_is_truncated_with_the_digest_on_both_sides(tmp_path):
    """Replays go through the same rule: the engines' finish reasons, the recorded request's digest per side."""
    request = traffic(sessions=1)[0]["request"]
    digest = digest_hex(request)
    done = EngineResult(key="k", text='<tool_call>\n{"name": "close_ticket", "arguments": {"ticket_id": 1}}\n'
                                      '</tool_call>', finish_reason="stop")
    cut_off = EngineResult(key="k", text='<tool_call>\n{"name": "close_ticket", "argu', finish_reason="length")
    analyzer, rows = Analyzer(1, SchemaRegistry(None)), RowBuffer()
    outcome = analyzer.pair(rows, "s", 0, None, TOOLS, side_output(done, PathConfig("target"), 1.0, digest),
                            side_output(cut_off, PathConfig("spec"), 1.0, digest), recorded=None)
    assert outcome.status == "truncated" and outcome.verdict is None
    same = analyzer.pair(rows, "s", 1, None, TOOLS, side_output(done, PathConfig("target"), 1.0, digest),
                         side_output(done, PathConfig("spec"), 1.0, digest), recorded=None)
    assert same.status == "matched" and same.kind == "identical"
    with Store(tmp_path / "r.duckdb") as store:
        store.write_rows(rows)
        outs = store.query("SELECT call_index, side, finish_reason, request_digest FROM outputs ORDER BY ALL")[1]
    assert outs == [(0, "baseline", "stop", digest), (0, "candidate", "length", digest),
                    (1, "baseline", "stop", digest), (1, "candidate", "stop", digest)]


# -- the request digest -----------------------------------------------------------------------------------------

def test_the_digest_leaves_out_what_does_not_define_the_request():
    base = record("s1", 0, "find tickets", "search_tickets", {"query": "x"},
                  history=[{"role": "user", "content": "hi"},
                           {"role": "assistant", "content": None,
                            "tool_calls": [tool_call("search_tickets", {"query": "a", "limit": 2}, "call_AAA")]},
                           {"role": "tool", "tool_call_id": "call_AAA", "content": "[]"}])["request"]
    other = copy.deepcopy(base)
    other.update(model="another", temperature=0.7, max_tokens=12, seed=3, user="u-9", metadata={"session_id": "z"})
    other["messages"][2]["tool_calls"][0]["id"] = other["messages"][3]["tool_call_id"] = "call_BBB"
    other["messages"][2]["tool_calls"][0]["function"]["arguments"] = '{"limit": 2,  "query": "a"}'
    other["messages"][2]["content"] = ""
    other["messages"][1]["content"] = [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]
    other["messages"][1]["refusal"] = None
    assert digest_hex(other) == digest_hex(base)
    for change, said in [({"tool_choice": "required"}, "tool_choice differs"),
                         ({"tools": TOOLS[:2]}, "tools differ (baseline only: retrieve_invoice)")]:
        changed = {**base, **change}
        assert digest_hex(changed) != digest_hex(base) and describe_difference(base, changed) == said
    answered = copy.deepcopy(base)
    answered["messages"][3]["tool_call_id"] = "call_other"  # the result answers another call: another request
    assert digest_hex(answered) != digest_hex(base)
    longer = copy.deepcopy(base)
    longer["messages"].append({"role": "user", "content": "and more"})
    assert describe_difference(base, longer) == "messages differ after message 5 (baseline 5, candidate 6 messages)"


def test_a_customer_report_counts_truncated_and_mismatched_calls_apart(tmp_path):
    from toolaudit.report.data import customer_report
    from toolaudit.report.markdown import render_markdown

    baseline, candidate = swapped_logs()
    store, run_id, _ = compare(tmp_path, baseline, cut(candidate, 0))
    report = customer_report(store, run_id, "acme")
    head = report["headline"]
    assert (head["calls"], head["drifted_calls"], head["truncated_calls"], head["mismatched_calls"]) == (47, 1, 1, 2)
    markdown = render_markdown(report)
    assert "1 call(s) stopped at max_tokens on one side or both (truncated) and are not compared" in markdown
    assert "2 paired call(s) answer different requests (mismatched)" in markdown


def test_a_pretty_printed_log_without_session_keys_pairs_by_request_too(tmp_path):
    """An OpenAI log written as one JSON array (read whole) keeps its calls without a session for compare."""
    baseline = traffic(sessions=2, with_keys=False)
    b = tmp_path / "b.json"
    b.write_text(json.dumps(baseline, indent=2))
    c = write_jsonl(tmp_path / "c.jsonl", with_drift(baseline, 1)[::-1])
    with Store(tmp_path / "a.duckdb") as store:
        _, counts = compare_logs(store, b, c, CompareOptions(schema_dir=None))
    assert counts.pairing["by"] == "request" and (counts.matched, counts.drifted) == (10, 1)
