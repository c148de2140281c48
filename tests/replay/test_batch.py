"""OpenAI Batch interop: export replay requests, import Batch output files as the two sides of a run."""

from __future__ import annotations

import json
from dataclasses import replace

import orjson
from click.testing import CliRunner
from conftest import REPO

from toolaudit.cli import cli
from toolaudit.compare.logs import CompareOptions, compare_logs
from toolaudit.ingest.traces import TraceCall, read_trace
from toolaudit.replay.batch import custom_id, import_results, parse_custom_id
from toolaudit.store import Store

BASELINE = REPO / "traces" / "example_baseline.jsonl"
CANDIDATE = REPO / "traces" / "example_candidate.jsonl"


def invoke(*args: str):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def recorded(path) -> dict[tuple[str, int], TraceCall]:
    return {c.key: c for c in read_trace(path) if isinstance(c, TraceCall)}


def batch_output(requests, responses: dict, path, extra: list[dict] = (), errors: dict = ()) -> None:
    """A Batch output file: a 200 result per request with a recorded response, in another order."""
    lines = []
    for req in requests:
        key = tuple(parse_custom_id(req["custom_id"])[:2])
        if key in dict(errors):
            lines.append({"id": "r", "custom_id": req["custom_id"], "response": None, "error": dict(errors)[key]})
        elif key in responses:
            body = {"id": "chatcmpl", "object": "chat.completion", **responses[key]}
            lines.append({"id": "r", "custom_id": req["custom_id"],
                          "response": {"status_code": 200, "request_id": "q", "body": body}, "error": None})
    lines.reverse()
    path.write_text("".join(json.dumps(x) + "\n" for x in [*lines, *extra]))


def test_export_writes_batch_input_lines(tmp_path):
    out = tmp_path / "req.jsonl"
    invoke("batch", "export", str(BASELINE), "--path", "target", "-o", str(out), "--model", "served-name")
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    calls = recorded(BASELINE)
    assert len(lines) == len(calls)
    first = lines[0]
    assert set(first) == {"custom_id", "method", "url", "body"}
    assert first["method"] == "POST" and first["url"] == "/v1/chat/completions"
    session, index, customer = parse_custom_id(first["custom_id"])
    call = calls[(session, index)]
    assert customer == call.customer
    body = first["body"]
    assert body["model"] == "served-name" and body["temperature"] == 0.0 and body["seed"] == 0
    # sampled: each call its own seed (one seed for every call would correlate their draws)
    from toolaudit.engines.paths import load_paths
    from toolaudit.replay.batch import request_body

    sampled = replace(load_paths()["target"], temperature=0.7)
    seeds = {request_body(sampled, [], [], key=f"s\x1f{i}")["seed"] for i in range(5)}
    assert len(seeds) == 5
    assert body["max_tokens"] == 96 and body["messages"] == call.request["messages"]
    assert [t["function"]["name"] for t in body["tools"]] == [t["function"]["name"] for t in call.tools]
    assert len({x["custom_id"] for x in lines}) == len(lines)
    assert parse_custom_id(custom_id("a#b,\"c", 3, None)) == ("a#b,\"c", 3, None)
    half = tmp_path / "half.jsonl"
    invoke("batch", "export", str(BASELINE), "--path", "target", "-o", str(half), "--shard", "1/2")
    assert 0 < len(half.read_text().splitlines()) < len(lines)


def test_two_imports_complete_a_run_that_agrees_with_compare(tmp_path):
    db = tmp_path / "t.duckdb"
    with Store(db) as store:
        compare_logs(store, BASELINE, CANDIDATE, CompareOptions(schema_dir=None))
    req_b, req_c = tmp_path / "req_b.jsonl", tmp_path / "req_c.jsonl"
    invoke("batch", "export", str(BASELINE), "--path", "target", "-o", str(req_b))
    invoke("batch", "export", str(BASELINE), "--path", "spec-ngram", "-o", str(req_c))
    requests_b = [json.loads(x) for x in req_b.read_text().splitlines()]
    requests_c = [json.loads(x) for x in req_c.read_text().splitlines()]
    base, cand = recorded(BASELINE), recorded(CANDIDATE)
    keys = sorted(base)
    broken, http = keys[0], keys[1]
    res_b, res_c = tmp_path / "res_b.jsonl", tmp_path / "res_c.jsonl"
    batch_output(requests_b, {k: c.response for k, c in base.items()}, res_b)
    unknown = {"id": "r", "custom_id": custom_id("nobody", 0, None),
               "response": {"status_code": 200, "body": {}}, "error": None}
    non_200 = {"id": "r", "custom_id": custom_id(*http, base[http].customer),
               "response": {"status_code": 400, "body": {"error": {"message": "bad tools"}}}, "error": None}
    cand_responses = {k: c.response for k, c in cand.items() if k != http}
    batch_output(requests_c, cand_responses, res_c, [unknown, non_200],
                 errors={broken: {"code": "server_error", "message": "boom"}})

    with Store(db) as store:
        run_id, first = import_results(store, str(req_b), str(res_b), "baseline", "target")
        assert first.paired == 0 and first.waiting == len(keys) and first.result_errors == 0
        assert store.run_row(run_id)["status"] == "running"
    result = invoke("batch", "import", str(req_c), str(res_c), "--side", "candidate", "--path", "spec-ngram",
                    "--run", str(run_id), "--db", str(db), "--schemas", "nowhere", "--json")
    assert "1 unknown custom_ids" in result.output
    with Store(db) as store:
        run = store.run_row(run_id)
        assert run["status"] == "complete" and run["kind"] == "batch"
        assert (run["baseline_name"], run["candidate_name"]) == ("target", "spec-ngram")
        counts = json.loads(run["counts"])["batch"]["candidate"]
        missing = [k for k in keys if k not in cand]
        assert counts["requests"] == len(keys) and counts["unknown"] == 1
        assert counts["missing"] == len(missing) and counts["result_errors"] == 2
        # every request is accounted for: a call row each (matched, truncated as compare finds it, or error)
        statuses = dict(store.query("SELECT match_status, count(*) FROM calls WHERE run_id = ? GROUP BY 1",
                                    [run_id])[1])
        truncated = store.query("SELECT session_id, call_index FROM calls WHERE run_id = 1 "
                                "AND match_status = 'truncated'")[1]
        assert len(truncated) == 1 and store.query("SELECT session_id, call_index FROM calls WHERE run_id = ? "
                                                   "AND match_status = 'truncated'", [run_id])[1] == truncated
        assert statuses == {"matched": len(keys) - len(missing) - 3, "truncated": 1, "error": len(missing) + 2}
        digests = store.query("SELECT count(DISTINCT request_digest), count(*) FROM outputs WHERE run_id = ? "
                              "GROUP BY session_id, call_index", [run_id])[1]
        assert {d for d, _ in digests} == {1}  # both sides' requests (another model) are the same request
        errors = {(r[0], r[1]): r[2] for r in store.query("SELECT session_id, call_index, detail FROM calls "
                                                          "WHERE run_id = ? AND match_status = 'error'", [run_id])[1]}
        assert "boom" in errors[broken] and "HTTP 400: bad tools" in errors[http]
        bad = store.rows("SELECT side, source, line, field, message FROM trace_errors WHERE run_id = ?", [run_id])
        assert len(bad) == 1 and bad[0]["side"] == "candidate" and "not a request" in bad[0]["message"]
        # the matched calls' verdicts are compare's
        query = """SELECT session_id, call_index, customer, tool_name, drift_kind, drifted, baseline_valid,
                   candidate_valid, arg_diff_count FROM calls WHERE run_id = ? AND match_status = 'matched'
                   ORDER BY ALL"""
        batch_rows = store.query(query, [run_id])[1]
        compare_rows = [r for r in store.query(query, [1])[1] if (r[0], r[1]) not in (broken, http)]
        assert batch_rows == compare_rows and any(r[5] for r in batch_rows)
        diffs = "SELECT session_id, call_index, arg_path, diff_kind, baseline_value, candidate_value FROM " \
                "arg_diffs WHERE run_id = ? ORDER BY ALL"
        assert store.query(diffs, [run_id])[1] == [r for r in store.query(diffs, [1])[1]
                                                   if (r[0], r[1]) not in (broken, http)]
        before = store.query("SELECT * FROM calls WHERE run_id = ? ORDER BY ALL", [run_id])[1]

        # importing the same file again changes nothing
        _, again = import_results(store, str(req_c), str(res_c), "candidate", "spec-ngram", run_id=run_id)
        assert again.already_paired == len(keys) - len(missing) - 2
        assert store.query("SELECT * FROM calls WHERE run_id = ? ORDER BY ALL", [run_id])[1] == before
        assert store.query("SELECT count(*) FROM outputs WHERE run_id = ?", [run_id])[1][0][0] == 2 * len(keys)

        # a results file of the retried requests fixes the error rows
        retry = tmp_path / "retry.jsonl"
        batch_output(requests_c, {broken: cand[broken].response, http: cand[http].response}, retry)
        _, fixed = import_results(store, str(req_c), str(retry), "candidate", "spec-ngram", run_id=run_id)
        assert fixed.paired == len(missing) + 2 and fixed.missing == len(missing)
        statuses = dict(store.query("SELECT match_status, count(*) FROM calls WHERE run_id = ? GROUP BY 1",
                                    [run_id])[1])
        assert statuses == {"matched": len(keys) - len(missing) - 1, "truncated": 1, "error": len(missing)}
        assert store.query("SELECT count(*) FROM outputs WHERE run_id = ?", [run_id])[1][0][0] == 2 * len(keys)
        assert store.query("SELECT count(*) FROM staged_results WHERE run_id = ?", [run_id])[1][0][0] == \
            2 * len(missing)  # only the calls still waiting for a candidate result


def test_import_refuses_another_path_on_a_side(tmp_path):
    req, res = tmp_path / "req.jsonl", tmp_path / "res.jsonl"
    invoke("batch", "export", str(BASELINE), "--path", "target", "-o", str(req), "--limit", "3")
    batch_output([orjson.loads(x) for x in req.read_text().splitlines()],
                 {k: c.response for k, c in recorded(BASELINE).items()}, res)
    db = str(tmp_path / "t.duckdb")
    invoke("batch", "import", str(req), str(res), "--side", "baseline", "--path", "target", "--db", db)
    bad = CliRunner().invoke(cli, ["batch", "import", str(req), str(res), "--side", "baseline", "--path",
                                   "spec-ngram", "--run", "1", "--db", db])
    assert bad.exit_code == 1 and "baseline side is path 'target'" in bad.output


def test_import_adds_a_side_to_the_run_its_name_names(tmp_path):
    base = {k: c.response for k, c in recorded(BASELINE).items()}
    db = str(tmp_path / "t.duckdb")
    files = {}
    for side, path in (("baseline", "target"), ("candidate", "spec-ngram")):
        req, res = tmp_path / f"req_{side}.jsonl", tmp_path / f"res_{side}.jsonl"
        invoke("batch", "export", str(BASELINE), "--path", path, "-o", str(req), "--limit", "3")
        batch_output([orjson.loads(x) for x in req.read_text().splitlines()], base, res)
        files[side] = (str(req), str(res), path)
    req, res, path = files["baseline"]
    invoke("batch", "import", req, res, "--side", "baseline", "--path", path, "--run-name", "nightly-batch", "--db", db)
    req, res, path = files["candidate"]
    unknown = CliRunner().invoke(cli, ["batch", "import", req, res, "--side", "candidate", "--path", path, "--run",
                                       "nightly-bacth", "--db", db])
    assert unknown.exit_code == 2 and "no run named 'nightly-bacth'" in unknown.output
    invoke("batch", "import", req, res, "--side", "candidate", "--path", path, "--run", "nightly-batch", "--db", db)
    with Store(db, read_only=True) as store:
        assert [(r["name"], r["status"]) for r in store.rows("SELECT * FROM runs")] == [("nightly-batch", "complete")]
