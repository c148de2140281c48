"""End-to-end compare of two real JSONL logs into a real DuckDB file."""

from __future__ import annotations

import json

import pytest
from conftest import REPO, line, tool_call, write_jsonl

from toolaudit.compare.logs import CompareOptions, compare_logs
from toolaudit.store import Store


def run_compare(tmp_path, db_path, baseline, candidate, **opts):
    b = write_jsonl(tmp_path / "b.jsonl", baseline)
    c = write_jsonl(tmp_path / "c.jsonl", candidate)
    store = Store(db_path)
    run_id, counts = compare_logs(store, b, c, CompareOptions(schema_dir=None, **opts))
    return store, run_id, counts


def calls_by_key(store, run_id):
    rows = store.rows("SELECT * FROM calls WHERE run_id = ? ORDER BY session_id, call_index", [run_id])
    return {(r["session_id"], r["call_index"]): r for r in rows}


def schema_errors(store, run_id):
    """`outputs.schema_errors` by (session, side)."""
    return {(r[0], r[1]): r[2] for r in store.query(
        "SELECT session_id, side, schema_errors FROM outputs WHERE run_id = ?", [run_id])[1]}


def verdicts(rows, sessions):
    """Each session's first call as (drift kind, baseline valid, candidate valid)."""
    return {s: (rows[(s, 0)]["drift_kind"], rows[(s, 0)]["baseline_valid"], rows[(s, 0)]["candidate_valid"])
            for s in sessions}


def test_reformatting_is_not_drift(tmp_path, db_path):
    args = {"query": "open", "limit": 50, "filters": {"status": ["open", "pending"]}}
    baseline = [line(calls=[tool_call("search_tickets", json.dumps(args), "a")])]
    reformatted = '{ "filters" : {"status": ["open","pending"]},\n "limit": 50, "query": "open" }'
    candidate = [line(calls=[tool_call("search_tickets", reformatted, "zzz")])]
    store, run_id, counts = run_compare(tmp_path, db_path, baseline, candidate)
    row = calls_by_key(store, run_id)[("s1", 0)]
    assert row["drift_kind"] == "identical" and row["drifted"] is False
    assert row["exact_text_match"] is False  # the raw text did differ
    assert row["baseline_valid"] is True and row["candidate_valid"] is True
    assert store.query("SELECT count(*) FROM arg_diffs")[1][0][0] == 0


def test_each_drift_kind_and_argument_paths(tmp_path, db_path):
    base_args = {"query": "open", "limit": 50, "filters": {"status": ["open", "pending"]}}
    pairs = [
        ({"query": "open", "limit": 500, "filters": {"status": ["open", "pending"]}}, "arguments_changed"),
        ({"query": "open", "limit": 50, "filters": {"status": ["closed", "pending"]}}, "arguments_changed"),
        ({"query": "open", "limit": "50", "filters": {"status": ["open", "pending"]}}, "schema_broken"),
        ({"limit": 50, "filters": {"status": ["open", "pending"]}}, "schema_broken"),
    ]
    baseline, candidate = [], []
    for i, (cand_args, _) in enumerate(pairs):
        baseline.append(line(session=f"s{i}", calls=[tool_call("search_tickets", base_args)]))
        candidate.append(line(session=f"s{i}", calls=[tool_call("search_tickets", cand_args)]))
    # tool name changed, call count changed, unparseable, text only
    baseline.append(line(session="t", calls=[tool_call("search_tickets", base_args)]))
    candidate.append(line(session="t", calls=[tool_call("close_ticket", {"ticket_id": 4})]))
    baseline.append(line(session="u", calls=[tool_call("close_ticket", {"ticket_id": 4})]))
    candidate.append(line(session="u", calls=[tool_call("close_ticket", {"ticket_id": 4}),
                                              tool_call("close_ticket", {"ticket_id": 5}, "c2")]))
    baseline.append(line(session="v", calls=[tool_call("close_ticket", {"ticket_id": 4})]))
    candidate.append(line(session="v", content='<tool_call>{"name": "close_ticket", "arguments": {"ticket_'))
    baseline.append(line(session="w", content="Sure.", calls=[tool_call("close_ticket", {"ticket_id": 4})]))
    candidate.append(line(session="w", content="Certainly.", calls=[tool_call("close_ticket", {"ticket_id": 4})]))

    store, run_id, counts = run_compare(tmp_path, db_path, baseline, candidate)
    rows = calls_by_key(store, run_id)
    for i, (_, kind) in enumerate(pairs):
        assert rows[(f"s{i}", 0)]["drift_kind"] == kind, i
    assert rows[("t", 0)]["drift_kind"] == "tool_name_changed"
    assert rows[("u", 0)]["drift_kind"] == "call_count_changed"
    assert rows[("v", 0)]["drift_kind"] == "unparseable"
    assert rows[("w", 0)]["drift_kind"] == "text_only" and rows[("w", 0)]["drifted"] is False
    diffs = store.rows("SELECT session_id, arg_path, diff_kind, baseline_value, candidate_value FROM arg_diffs "
                       "WHERE run_id = ? ORDER BY session_id", [run_id])
    by_session = {(d["session_id"], d["arg_path"]): d for d in diffs}
    assert by_session[("s0", "limit")]["diff_kind"] == "value_changed"
    assert (by_session[("s0", "limit")]["baseline_value"], by_session[("s0", "limit")]["candidate_value"]) \
        == ("50", "500")
    assert by_session[("s1", "filters.status[0]")]["diff_kind"] == "value_changed"
    assert by_session[("s2", "limit")]["diff_kind"] == "type_changed"
    assert by_session[("s3", "query")]["diff_kind"] == "missing"
    assert counts.drifted == 7 and counts.matched == 8


def test_parallel_calls_matched_by_name_when_order_differs(tmp_path, db_path):
    a = tool_call("search_tickets", {"query": "x"}, "1")
    b = tool_call("close_ticket", {"ticket_id": 3}, "2")
    b2 = tool_call("close_ticket", {"ticket_id": 30}, "2")
    store, run_id, _ = run_compare(tmp_path, db_path, [line(calls=[a, b]), line(session="s2", calls=[a, b])],
                                   [line(calls=[b, a]), line(session="s2", calls=[b2, a])])
    rows = calls_by_key(store, run_id)
    assert rows[("s1", 0)]["drift_kind"] == "identical"
    assert rows[("s2", 0)]["drift_kind"] == "arguments_changed"
    diff = store.rows("SELECT * FROM arg_diffs WHERE session_id = 's2'")
    assert [(d["tool_name"], d["arg_path"], d["call_position"]) for d in diff] == [("close_ticket", "ticket_id", 1)]


def test_sessions_and_statistics(tmp_path, db_path):
    baseline, candidate = [], []
    # 10 sessions of 5 calls for two customers; session 0 of acme has one drifted call
    for s in range(10):
        customer = "acme" if s < 5 else "globex"
        for i in range(5):
            args = {"query": f"q{i}", "limit": 10}
            baseline.append(line(session=f"s{s}", customer=customer, calls=[tool_call("search_tickets", args)]))
            if s == 0 and i == 2:
                args = {"query": f"q{i}", "limit": 100}
            candidate.append(line(session=f"s{s}", customer=customer, calls=[tool_call("search_tickets", args)]))
    store, run_id, _ = run_compare(tmp_path, db_path, baseline, candidate)
    cust = {r["customer"]: r for r in store.rows("SELECT * FROM customer_drift WHERE run_id = ?", [run_id])}
    assert cust["acme"]["drifted_calls"] == 1 and cust["acme"]["calls"] == 25
    assert cust["acme"]["sessions_with_drift"] == 1 and cust["acme"]["sessions"] == 5
    assert cust["globex"]["drifted_calls"] == 0
    assert cust["acme"]["ci_low"] < 0.04 < cust["acme"]["ci_high"]
    sess = store.rows("SELECT * FROM session_drift WHERE run_id = ? ORDER BY session_id", [run_id])
    # per-tool rate is 1/50 -> compounded over 5 calls = 1 - 0.98^5
    assert sess[0]["compounded_p"] == pytest.approx(1 - 0.98 ** 5)
    assert sess[0]["any_drift"] is True and sess[1]["any_drift"] is False


def test_unmatched_sessions_are_counted_not_drift(tmp_path, db_path):
    baseline = [line(session="both", calls=[tool_call("close_ticket", {"ticket_id": 1})]),
                line(session="only_b", calls=[tool_call("close_ticket", {"ticket_id": 1})])]
    candidate = [line(session="both", calls=[tool_call("close_ticket", {"ticket_id": 1})]),
                 line(session="only_c", calls=[tool_call("close_ticket", {"ticket_id": 2})])]
    store, run_id, counts = run_compare(tmp_path, db_path, baseline, candidate)
    assert (counts.matched, counts.baseline_only, counts.candidate_only, counts.drifted) == (1, 1, 1, 0)
    statuses = dict(store.query("SELECT session_id, match_status FROM calls")[1])
    assert statuses == {"both": "matched", "only_b": "baseline_only", "only_c": "candidate_only"}


def test_example_logs_report_exactly_the_injected_drifts(tmp_path, db_path):
    expected_file = REPO / "traces" / "example_expected.json"
    if not expected_file.exists():
        pytest.skip("example traces not generated")
    expected = json.loads(expected_file.read_text())
    store = Store(db_path)
    run_id, counts = compare_logs(store, REPO / "traces/example_baseline.jsonl",
                                  REPO / "traces/example_candidate.jsonl", CompareOptions(schema_dir=None))
    drifted = {(r["session_id"], r["call_index"]): r["drift_kind"] for r in store.rows(
        "SELECT session_id, call_index, drift_kind FROM calls WHERE run_id = ? AND drifted", [run_id])}
    want = {(d["session_id"], int(d["call_index"])): d["kind"] for d in expected["drifts"]}
    assert drifted == want
    paths = {(r["session_id"], r["call_index"], r["arg_path"]) for r in store.rows(
        "SELECT session_id, call_index, arg_path FROM arg_diffs WHERE run_id = ?", [run_id])}
    want_paths = {(d["session_id"], int(d["call_index"]), d["path"]) for d in expected["drifts"] if d.get("path")}
    assert want_paths <= paths
    unmatched = {(r["session_id"], r["match_status"]) for r in store.rows(
        "SELECT DISTINCT session_id, match_status FROM calls WHERE run_id = ? "
        "AND match_status NOT IN ('matched', 'truncated')", [run_id])}
    assert unmatched == {(s, "baseline_only") for s in expected["unmatched"]["baseline_only"]} | {
        (s, "candidate_only") for s in expected["unmatched"]["candidate_only"]}
    truncated = {(r["session_id"], r["call_index"]) for r in store.rows(
        "SELECT session_id, call_index FROM calls WHERE run_id = ? AND match_status = 'truncated'", [run_id])}
    assert truncated == {(t["session_id"], t["call_index"]) for t in expected["truncated"]}
    assert (counts.truncated, counts.mismatched) == (1, 0)  # the example's requests agree pair by pair
    text_only = {(r["session_id"], r["call_index"]) for r in store.rows(
        "SELECT session_id, call_index FROM calls WHERE run_id = ? AND drift_kind = 'text_only'", [run_id])}
    assert text_only == {(t["session_id"], int(t["call_index"])) for t in expected["text_only"]}


def test_worker_processes_give_exactly_the_sequential_result(tmp_path):
    base_lines = (REPO / "traces/example_baseline.jsonl").read_bytes().splitlines()
    cand_lines = (REPO / "traces/example_candidate.jsonl").read_bytes().splitlines()
    broken_at = len(cand_lines) // 2
    cand_lines.insert(broken_at, b"{broken")  # an error row deep inside a later chunk
    cand_lines.append(cand_lines[10])  # a duplicate call index, found across chunks
    b = tmp_path / "b.jsonl"
    c = tmp_path / "c.jsonl"
    b.write_bytes(b"\n".join(base_lines * 2) + b"\n")  # repeated lines are duplicates too
    c.write_bytes(b"\n".join(cand_lines) + b"\n")
    tables = {}
    for workers in (1, 3):
        with Store(tmp_path / f"w{workers}.duckdb") as store:
            run_id, counts = compare_logs(store, b, c, CompareOptions(schema_dir=None, workers=workers))
            tables[workers] = {
                name: store.query(f"SELECT * EXCLUDE (run_id) FROM {name} ORDER BY ALL")[1]
                for name in ("calls", "outputs", "arg_diffs", "trace_errors", "schema_issues")}
            tables[workers]["counts"] = counts.as_dict()
    assert tables[1] == tables[3]
    errors = tables[3]["trace_errors"]
    assert any(e[2] == broken_at + 1 and "not valid JSON" in e[4] for e in errors)
    assert sum("duplicate call index" in e[4] for e in errors) == len(base_lines) + 1


def test_call_indices_and_duplicates_match_a_sequential_read(tmp_path):
    """Explicit and implicit call indices mixed in one session, and a repeated index, exactly as read_trace
    (traces.CallIndexer, line by line) assigns them; compare assigns them in SQL (store.staging)."""
    from toolaudit.ingest.traces import TraceLineError, read_trace

    close = [tool_call("close_ticket", {"ticket_id": 1})]
    records = []
    for n, index in enumerate([None, 3, None, 1, None, 3, None, 0, None]):
        records.append(line(session="m", call_index=index, calls=close))
        records.append(line(session=f"other{n % 2}", calls=close))  # interleaved sessions
    path = write_jsonl(tmp_path / "log.jsonl", records)
    want_calls, want_errors = set(), set()
    for item in read_trace(path):
        if isinstance(item, TraceLineError):
            want_errors.add((item.line, item.message))
        else:
            want_calls.add((item.session_id, item.call_index, item.line))
    assert len(want_errors) == 2  # the second explicit 3 and the explicit 0 repeat earlier indices
    for workers in (1, 2):
        with Store(tmp_path / f"w{workers}.duckdb") as store:
            compare_logs(store, path, path, CompareOptions(schema_dir=None, workers=workers))
            got = set(store.query("SELECT session_id, call_index, line FROM outputs WHERE side = 'baseline'")[1])
            errors = set(store.query("SELECT line, message FROM trace_errors WHERE side = 'baseline'")[1])
            kinds = set(store.query("SELECT DISTINCT drift_kind FROM calls")[1])
        assert got == want_calls and errors == want_errors and kinds == {("identical",)}


def test_identical_pairs_get_each_sides_own_schema_verdict(tmp_path, db_path):
    """The candidate side is scanned without validating; an identical pair reuses the baseline's verdict only
    when that cannot differ (same tools, no schema errors). Otherwise the candidate is validated on its own.
    Tools that differ make another request (mismatched, not compared); the same tools written in another key
    order are the same request, validated on the candidate's own."""
    from conftest import CLOSE_TOOL, SEARCH_TOOL

    lenient = json.loads(json.dumps(SEARCH_TOOL))
    del lenient["function"]["parameters"]["properties"]["limit"]["minimum"]
    reordered = json.loads(json.dumps(SEARCH_TOOL, sort_keys=True))
    reordered["function"] = dict(reversed(list(reordered["function"].items())))
    zero = {"query": "a", "limit": 0}
    baseline = [line(session="invalid", calls=[tool_call("search_tickets", {"query": 5})]),
                line(session="tools", calls=[tool_call("search_tickets", zero)], tools=[lenient]),
                line(session="order", calls=[tool_call("search_tickets", {"query": 7})]),
                line(session="ok", calls=[tool_call("search_tickets", {"query": "a"})])]
    candidate = [line(session="invalid", calls=[tool_call("search_tickets", '{ "query" : 5 }')]),
                 line(session="tools", calls=[tool_call("search_tickets", zero)]),
                 line(session="order", calls=[tool_call("search_tickets", {"query": 7})],
                      tools=[reordered, CLOSE_TOOL]),
                 line(session="ok", calls=[tool_call("search_tickets", {"query": "a"})]),
                 line(session="only", calls=[tool_call("search_tickets", {"limit": 2})])]
    store, run_id, counts = run_compare(tmp_path, db_path, baseline, candidate)
    rows = calls_by_key(store, run_id)
    assert verdicts(rows, ("invalid", "order", "ok")) == {
        "invalid": ("identical", False, False), "order": ("identical", False, False), "ok": ("identical", True, True)}
    assert rows[("tools", 0)]["match_status"] == "mismatched" and rows[("tools", 0)]["drift_kind"] is None
    assert rows[("tools", 0)]["detail"] == ("different requests: tools differ (candidate only: close_ticket; "
                                              "definitions differ: search_tickets)")
    errors = schema_errors(store, run_id)
    assert errors[("invalid", "baseline")] and errors[("invalid", "baseline")] == errors[("invalid", "candidate")]
    assert errors[("order", "baseline")] and errors[("order", "baseline")] == errors[("order", "candidate")]
    assert errors[("ok", "baseline")] is None and errors[("ok", "candidate")] is None
    assert "required" in errors[("only", "candidate")]  # a call in one log only still gets its verdict
    assert (counts.matched, counts.mismatched, counts.candidate_only, counts.kinds) == (3, 1, 1, {"identical": 3})


def test_interrupted_compare_keeps_whole_writes(tmp_path, db_path, monkeypatch):
    """Ctrl-C while differing pairs are being diffed, or while the agreeing pairs are written: the run is
    marked interrupted and holds whole writes only, each call once; an earlier complete run is untouched."""
    from toolaudit.compare.join import Join
    from toolaudit.store.staging import Staging

    b = write_jsonl(tmp_path / "b.jsonl", [line(session=f"s{i}", calls=[tool_call("close_ticket", {"ticket_id": i})])
                                           for i in range(50)])
    c = write_jsonl(tmp_path / "c.jsonl", [line(session=f"s{i}", calls=[tool_call("close_ticket", {"ticket_id": -i})])
                                           for i in range(50)])
    store = Store(db_path)
    first, _ = compare_logs(store, b, b, CompareOptions(schema_dir=None))
    calls = {"n": 0}
    original = Join._diff

    def exploding(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 30:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Join, "_diff", exploding)
    with pytest.raises(KeyboardInterrupt):
        compare_logs(store, b, c, CompareOptions(schema_dir=None, rows_per_write=10))
    monkeypatch.undo()

    def broken_insert(self, *args, **kwargs):
        self.con.execute("BEGIN TRANSACTION")
        self.con.execute("ROLLBACK")
        raise KeyboardInterrupt

    monkeypatch.setattr(Staging, "write_agreeing", broken_insert)
    with pytest.raises(KeyboardInterrupt):
        compare_logs(store, b, b, CompareOptions(schema_dir=None))
    monkeypatch.undo()
    statuses = dict(store.query("SELECT run_id, status FROM runs")[1])
    assert statuses == {first: "complete", first + 1: "interrupted", first + 2: "interrupted"}
    assert store.query("SELECT count(*) FROM calls WHERE run_id = ?", [first])[1][0][0] == 50
    n, distinct = store.query("SELECT count(*), count(DISTINCT session_id) FROM calls WHERE run_id = ?",
                              [first + 1])[1][0]
    assert n == distinct == 20  # two whole writes of 10 before the 30th pair
    assert store.query("SELECT count(*) FROM calls WHERE run_id = ?", [first + 2])[1][0][0] == 0
    # nothing left behind on the connection: a new comparison on the same store runs
    run_id, counts = compare_logs(store, b, b, CompareOptions(schema_dir=None))
    assert counts.matched == 50 and counts.kinds == {"identical": 50}


def test_small_chunks_and_commits_give_the_same_tables(tmp_path, monkeypatch):
    """Many chunks per side and many transactions in the final inserts (ranges of pairs, groups of chunk
    files) store exactly what one chunk and one transaction store."""
    import toolaudit.compare.logs as compare
    import toolaudit.store.staging as staging

    baseline, candidate = [], []
    for i in range(3000):
        args = {"query": f"q{i} " + "x" * 200, "limit": i % 7 + 1}
        baseline.append(line(session=f"s{i // 4}", calls=[tool_call("search_tickets", args)]))
        drifted = {**args, "limit": 0} if i % 50 == 0 else args
        if i % 97 != 0:  # some calls in the baseline only
            candidate.append(line(session=f"s{i // 4}", calls=[tool_call("search_tickets", drifted)]))
    b, c = write_jsonl(tmp_path / "b.jsonl", baseline), write_jsonl(tmp_path / "c.jsonl", candidate)
    assert b.stat().st_size > 1 << 20  # big enough for split_file to cut it

    def tables(db, **opts):
        with Store(db) as store:
            _, counts = compare_logs(store, b, c, CompareOptions(schema_dir=None, **opts))
            out = {name: store.query(f"SELECT * EXCLUDE (run_id) FROM {name} ORDER BY ALL")[1]
                   for name in ("calls", "outputs", "arg_diffs", "trace_errors")}
        return out, counts.as_dict()

    whole, whole_counts = tables(tmp_path / "whole.duckdb", workers=1)
    monkeypatch.setattr(compare, "CHUNK_BYTES", 64 << 10)
    monkeypatch.setattr(staging, "ROWS_PER_COMMIT", 500)
    commits = []
    original = staging.Staging._commit
    monkeypatch.setattr(staging.Staging, "_commit", lambda self, *a: commits.append(1) or original(self, *a))
    parts, parts_counts = tables(tmp_path / "parts.duckdb", workers=2)
    assert len(commits) > 10 and parts == whole and parts_counts == whole_counts
    assert len(whole["calls"]) == 3000 and len(whole["outputs"]) == 3000 + len(candidate)
    # a call missing from a candidate session shifts that session's later (implicit) indices: more drift
    assert whole_counts["baseline_only"] == 31 and whole_counts["drifted"] > 59


def test_a_tool_the_request_did_not_offer_is_invalid(tmp_path, db_path):
    """A call to a name the request never offered cannot run in the agent's runtime: invalid, with an error that
    names the tools offered (identical pairs share the baseline's verdict). A request that offered no tools cannot
    judge a name: its validity stays unknown (NULL)."""
    ok = {"query": "a"}
    baseline = [line(session="renamed", calls=[tool_call("search_tickets", ok)]),
                line(session="both", calls=[tool_call("get_meta", {"type": "json"})]),
                line(session="untooled", calls=[tool_call("get_meta", {})], tools=[])]
    candidate = [line(session="renamed", calls=[tool_call("search_tickets_v2", ok)]),
                 line(session="both", calls=[tool_call("get_meta", {"type": "json"})]),
                 line(session="untooled", calls=[tool_call("get_meta", {})], tools=[])]
    store, run_id, counts = run_compare(tmp_path, db_path, baseline, candidate)
    rows = calls_by_key(store, run_id)
    assert verdicts(rows, ("renamed", "both", "untooled")) == {
        "renamed": ("tool_name_changed", True, False), "both": ("identical", False, False),
        "untooled": ("identical", None, None)}
    errors = schema_errors(store, run_id)
    assert json.loads(errors[("renamed", "candidate")]) == [
        {"tool": "search_tickets_v2", "errors": ["not a tool the request offered (close_ticket, search_tickets)"]}]
    assert errors[("renamed", "baseline")] is None and errors[("both", "candidate")] == errors[("both", "baseline")]


def test_a_sample_calling_a_tool_not_offered_is_invalid_and_keeps_its_signature():
    """Sampled: the invented call counts against the schema-valid rate, and its label stays its signature (which
    name a path invents is part of its distribution); a declared call with bad arguments is one `schema_invalid`."""
    from conftest import CLOSE_TOOL, SEARCH_TOOL

    from toolaudit.compare.outcomes import OutcomeKind
    from toolaudit.compare.pairs import Analyzer, SideOutput
    from toolaudit.validate.schemas import SchemaRegistry
    from toolaudit.validate.toolcalls import parse_text

    analyzer = Analyzer(1, SchemaRegistry(None))

    def outcome(text: str):
        return analyzer.sample_outcome([SEARCH_TOOL, CLOSE_TOOL], SideOutput(parse_text(text), text, "p"))

    invented = outcome('<tool_call>{"name": "get_meta", "arguments": {"type": "json"}}</tool_call>')
    assert invented.kind == OutcomeKind.SCHEMA_INVALID and invented.outcome.startswith("get_meta{")
    bad = outcome('<tool_call>{"name": "close_ticket", "arguments": {"ticket_id": "x"}}</tool_call>')
    assert (bad.kind, bad.outcome) == (OutcomeKind.SCHEMA_INVALID, "schema_invalid")
    good = outcome('<tool_call>{"name": "close_ticket", "arguments": {"ticket_id": 4}}</tool_call>')
    assert good.kind == OutcomeKind.TOOL_CALL and good.outcome.startswith("close_ticket{")
