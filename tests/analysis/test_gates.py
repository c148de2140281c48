"""The gates agree and say why: `check` and `frontier` judge a budget by one rule and print it, `--against`
tests the difference of two proportions and warns when the inputs differ, error rows fail `check`, and `check`
and `report` answer in JSON for CI. Real DuckDB files built by `compare` from small JSONL logs."""

from __future__ import annotations

import csv
import io
import json

import pytest
from click.testing import CliRunner
from conftest import line, tool_call, write_jsonl

from toolaudit.analysis.frontier import Budget, frontier
from toolaudit.analysis.rules import RULE_NAMES, Rule, judge_calls
from toolaudit.analysis.stats import wilson
from toolaudit.cli import cli
from toolaudit.cli.common import RULES
from toolaudit.compare.logs import CompareOptions, compare_logs
from toolaudit.store import Store


def _logs(tmp_path, name: str, calls: int, drifted: int, bad_lines: int = 0, prefix: str = "s"):
    """`calls` calls in sessions of 5 named `<prefix>NNN`; one drifted call in each of the first `drifted`
    sessions; `bad_lines` unreadable candidate lines."""
    base, cand = [], []
    for i in range(calls):
        session = f"{prefix}{i // 5:03d}"
        base.append(line(session=session, calls=[tool_call("search_tickets", {"query": "q", "limit": 5})]))
        limit = 50 if i % 5 == 0 and i // 5 < drifted else 5
        cand.append(line(session=session, calls=[tool_call("search_tickets", {"query": "q", "limit": limit})]))
    cand += ["not json"] * bad_lines
    return write_jsonl(tmp_path / f"{name}-b.jsonl", base), write_jsonl(tmp_path / f"{name}-c.jsonl", cand)


def _compare(store: Store, tmp_path, name: str, calls: int, drifted: int, **kw) -> int:
    b, c = _logs(tmp_path, name, calls, drifted, **kw)
    return compare_logs(store, b, c, CompareOptions(schema_dir=None, run_name=name))[0]


@pytest.fixture(scope="module")
def issue_db(tmp_path_factory):
    """The issue's runs: 1 is 20/440 drifted (4.55%, 95% CI 2.96%-6.92%); 2 is 3/50 (6.00%, 2.06%-16.22%) on 50
    of run 1's calls, with 3 unreadable lines; 3 is 20/440 on other sessions."""
    tmp_path = tmp_path_factory.mktemp("issue")
    db = tmp_path / "issue.duckdb"
    with Store(db) as store:
        assert _compare(store, tmp_path, "nightly", 440, 20) == 1
        assert _compare(store, tmp_path, "small", 50, 3, bad_lines=3) == 2
        assert _compare(store, tmp_path, "elsewhere", 440, 20, prefix="t") == 3
    return str(db)


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_check_and_frontier_judge_a_budget_by_the_same_rule(issue_db):
    """4.55% of 440 calls against a 5% budget: over it on the upper bound (6.92%), within it on the point."""
    gate = invoke("check", "--db", issue_db, "--run", "1", "--max-call-drift", "5%")
    table = invoke("frontier", "--db", issue_db, "--run", "1", "--max-call-drift", "5%", "--json")
    assert gate.exit_code == 1 and table.exit_code == 0, gate.output + table.output
    assert "call drift upper bound 6.92% > max 5.00% (point 4.55%, 95% CI 2.96%-6.92%)" in gate.output
    assert gate.output.splitlines()[-1].startswith("rule: upper bound of the 95% Wilson interval: fails unless")
    overall = json.loads(table.output)["overall"]
    assert overall["budget"] == {"max_call_drift": 0.05, "max_session_drift": None, "max_shifted_calls": None,
                                 "max_excess": None, "rule": "upper"}
    remedy = overall["remedies"][0]
    assert remedy["within_budget"] is False and remedy["budget_checks"][0]["figure"] == pytest.approx(0.0692, abs=1e-4)
    assert overall["recommendation"]["choice"] == "target-only"

    gate = invoke("check", "--db", issue_db, "--run", "1", "--max-call-drift", "5%", "--rule", "point")
    text = invoke("frontier", "--db", issue_db, "--run", "1", "--max-call-drift", "5%", "--rule", "point")
    assert gate.exit_code == 0 and "call drift 4.55% <= max 5.00%" in gate.output
    assert gate.output.splitlines()[-1].startswith("rule: point estimate: fails when the measured rate is over")
    assert text.exit_code == 0 and "recommended: candidate (within budget with the lowest drift point estimate" \
        in text.output
    assert text.output.splitlines()[-1] == gate.output.splitlines()[-1]  # the same rule line on both
    head = text.output.splitlines()[0]  # a plain run is a frontier of one, not a matrix of none
    assert "a run outside a matrix: a frontier of one candidate" in head and "0 candidates" not in head, head

    with Store(issue_db, read_only=True) as store:  # the library agrees with itself for every rule
        for rule in Rule:
            judged = judge_calls(wilson(20, 440), 0.05, rule)
            remedy = frontier(store, 1, budget=Budget(max_call_drift=0.05, rule=rule)).remedies[0]
            assert remedy.within_budget is judged.ok
        assert [judge_calls(wilson(20, 440), 0.05, r).ok for r in Rule] == [False, True, True]
    assert RULES == RULE_NAMES  # the CLI's choices name every rule


def test_against_a_larger_run_is_not_a_regression_on_noise_and_says_the_inputs_differ(issue_db):
    """6.00% of 50 calls vs 4.55% of 440: a 1.45pp rise whose interval includes 0 passes; the inputs differ."""
    result = invoke("check", "--db", issue_db, "--run", "2", "--against", "1", "--max-increase", "0.5pp",
                    "--allow-errors", "3")
    assert result.exit_code == 0, result.output
    assert ("call drift rose 1.45pp vs run 1 (4.55% of 440 -> 6.00% of 50 calls; 95% CI of the difference -3.14pp "
            "to +11.79pp): not significant (the interval includes 0); 1.45pp > max increase 0.50pp") in result.stdout
    assert result.stderr.splitlines() == [
        "warning: run 2 and run 1 were measured on different inputs: 50 vs 440 calls, 50 (session, call index) "
        "keys shared, 0 only in run 2, 390 only in run 1; the difference mixes the decode paths' change with the "
        "traffic's"]
    disjoint = invoke("check", "--db", issue_db, "--run", "3", "--against", "1", "--max-increase", "0")
    assert disjoint.exit_code == 0 and "unchanged vs run 1" in disjoint.stdout
    assert "440 vs 440 calls, 0 (session, call index) keys shared, 440 only in run 3, 440 only in run 1" \
        in disjoint.stderr


def test_error_rows_fail_the_gate_unless_allowed(issue_db):
    result = invoke("check", "--db", issue_db, "--run", "2", "--max-call-drift", "50%")
    assert result.exit_code == 1
    assert result.output.splitlines()[:2] == [
        "3 error rows (3 input records the readers could not use) > allowed 0 (--allow-errors N); the drift "
        "figures leave them out",
        "  see them: toolaudit sql \"SELECT side, source, line, field, message FROM trace_errors WHERE run_id = 2 "
        f"ORDER BY side, source, line\" --db {issue_db}"]
    assert invoke("check", "--db", issue_db, "--run", "2", "--max-call-drift", "50%", "--allow-errors", "2"
                  ).exit_code == 1
    allowed = invoke("check", "--db", issue_db, "--run", "2", "--max-call-drift", "50%", "--allow-errors", "3")
    assert allowed.exit_code == 0 and "3 error rows (3 input records the readers could not use) <= allowed 3" \
        in allowed.output
    assert invoke("check", "--db", issue_db, "--run", "2", "--max-call-drift", "50%", "--allow-errors", "-1"
                  ).exit_code == 2


def test_calls_an_engine_failed_are_error_rows_too(tmp_path):
    """A replay stores a failed call as a calls row with match_status 'error' (the reason in `detail`)."""
    db = tmp_path / "failed.duckdb"
    with Store(db) as store:
        _compare(store, tmp_path, "run", 20, 0)
        store.con.execute("UPDATE calls SET match_status = 'error', drift_kind = NULL, drifted = NULL, "
                          "detail = 'candidate: HTTP 503' WHERE run_id = 1 AND session_id = 's000' AND call_index < 2")
    result = invoke("check", "--db", str(db), "--max-call-drift", "50%")
    assert result.exit_code == 1
    assert result.output.splitlines()[:2] == [
        "2 error rows (2 calls an engine failed) > allowed 0 (--allow-errors N); the drift figures leave them out",
        "  see them: toolaudit sql \"SELECT session_id, call_index, customer, detail FROM calls WHERE run_id = 1 "
        f"AND match_status = 'error' ORDER BY session_id, call_index\" --db {db}"]
    listed = invoke("sql", "SELECT session_id, call_index, customer, detail FROM calls WHERE run_id = 1 AND "
                    "match_status = 'error' ORDER BY session_id, call_index", "--db", str(db), "--json")
    assert [r["detail"] for r in json.loads(listed.output)] == ["candidate: HTTP 503"] * 2


def test_check_json_is_one_object_with_every_budget_and_the_same_exit_codes(issue_db):
    result = invoke("check", "--db", issue_db, "--run", "1", "--max-call-drift", "5%", "--max-session-drift",
                    "50%", "--json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert (data["verdict"], data["exit_code"], data["rule"]) == ("fail", 1, "upper")
    assert data["reasons"] == ["call drift upper bound 6.92% > max 5.00% (point 4.55%, 95% CI 2.96%-6.92%)"]
    [run] = data["runs"]
    assert (run["run_id"], run["calls"], run["drifted_calls"], run["verdict"]) == (1, 440, 20, "fail")
    calls, sessions, errors = run["checks"]
    assert calls["name"] == "call_drift" and calls["ok"] is False and calls["rule"] == "upper"
    assert calls["threshold"] == 0.05 and calls["estimate"] == pytest.approx(20 / 440)
    assert calls["interval"] == pytest.approx([0.029615, 0.069162], abs=1e-6)
    assert calls["figure"] == calls["interval"][1]
    assert calls["session_calls"] is None  # JSON null, not the string None
    assert '"session_calls": null' in result.stdout and "None" not in result.stdout
    assert sessions["name"] == "session_drift" and sessions["ok"] is True and sessions["session_calls"] == 5.0
    assert sessions["figure"] == pytest.approx(1 - (1 - calls["interval"][1]) ** 5)
    assert errors == {"name": "error_rows", "ok": True, "reason": "no error rows", "rule": "count", "figure": 0,
                      "estimate": None, "interval": None, "threshold": 0, "unusable_records": 0, "failed_calls": 0}

    passed = invoke("check", "--db", issue_db, "--run", "2", "--against", "1", "--max-increase", "0.5pp",
                    "--allow-errors", "3", "--json")
    assert passed.exit_code == 0
    data = json.loads(passed.stdout)  # the warning goes to stderr, so stdout stays one JSON object
    assert data["verdict"] == "pass" and data["reasons"] == [] and len(data["warnings"]) == 1
    increase = data["runs"][0]["checks"][0]
    assert (increase["name"], increase["rule"], increase["significant"], increase["threshold"]) == (
        "increase", "newcombe", False, 0.005)
    assert increase["interval"] == pytest.approx([-0.0314, 0.1179], abs=1e-4)
    assert increase["inputs"] == {"same": False, "calls": 50, "other_calls": 440, "shared": 50, "only_run": 0,
                                  "only_other": 390}
    missing = invoke("check", "--db", issue_db, "--run", "9", "--max-call-drift", "5%", "--json")
    assert missing.exit_code == 2 and missing.stdout == ""


def test_check_as_csv_is_one_row_per_bound_with_the_same_exit_code(issue_db):
    result = invoke("check", "--db", issue_db, "--run", "1", "--max-call-drift", "5%", "--max-session-drift",
                    "50%", "--as", "csv")
    assert result.exit_code == 1
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [r["bound"] for r in rows] == ["call_drift", "session_drift", "error_rows"]
    assert (rows[0]["ok"], rows[0]["rule"], float(rows[0]["threshold"])) == ("false", "upper", 0.05)
    assert float(rows[0]["figure"]) == pytest.approx(0.069162, abs=1e-6)  # the same figure as --json's


def test_check_json_of_a_matrix_names_each_candidate(tmp_path):
    base, clean = _logs(tmp_path, "clean", 200, 0)
    _, drifted = _logs(tmp_path, "drifted", 200, 30)
    db = str(tmp_path / "m.duckdb")
    made = invoke("compare", str(base), str(clean), str(drifted), "--candidate-name", "clean", "--candidate-name",
                  "drifted", "--db", db)
    assert made.exit_code == 0, made.output
    result = invoke("check", "--db", db, "--max-call-drift", "5%", "--json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert [(r["candidate"], r["verdict"]) for r in data["runs"]] == [("clean", "pass"), ("drifted", "fail")]
    assert data["reasons"] == ["candidate drifted (run 3): call drift upper bound 20.61% > max 5.00% "
                               "(point 15.00%, 95% CI 10.71%-20.61%)"]
    text = invoke("check", "--db", db, "--max-call-drift", "5%")
    assert text.output.splitlines()[0].startswith("candidate clean: ok: run 2: 0/200 calls drifted")


def test_report_json_lists_the_files_and_each_customers_headline(issue_db, tmp_path):
    out = tmp_path / "reports"
    result = invoke("report", "--db", issue_db, "--run", "1", "--all-customers", "--write", "json,md", "-o",
                    str(out), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["files"] == [str(out / "run-1" / "acme.json"), str(out / "run-1" / "acme.md")]
    assert all((out / "run-1" / name).is_file() for name in ("acme.json", "acme.md"))
    [customer] = data["customers"]
    assert (customer["customer"], customer["run_id"], customer["files"]) == ("acme", 1, data["files"])
    written = json.loads((out / "run-1" / "acme.json").read_text())
    assert customer["headline"] == written["headline"]  # the same figures the report file holds
    assert (customer["headline"]["calls"], customer["headline"]["drifted_calls"]) == (440, 20)
    assert data["frontier"] is None and data["remedies"] is None
    plain = invoke("report", "--db", issue_db, "--run", "1", "--all-customers", "--write", "json", "-o", str(out))
    assert plain.output.splitlines() == [str(out / "run-1" / "acme.json")]  # without --json: the paths, as before


def test_report_json_of_a_matrix_gives_the_recommendations(tmp_path):
    base, clean = _logs(tmp_path, "clean", 200, 0)
    _, drifted = _logs(tmp_path, "drifted", 200, 30)
    db = str(tmp_path / "m.duckdb")
    assert invoke("compare", str(base), str(clean), str(drifted), "--db", db).exit_code == 0
    result = invoke("report", "--db", db, "--all-customers", "--write", "json", "-o", str(tmp_path / "r"),
                    "--max-call-drift", "5%", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["kind"] == "matrix" and len(data["files"]) == 3  # two candidates' reports and the remedy report
    assert [(c["run_id"], c["headline"]["drifted_calls"]) for c in data["customers"]] == [(2, 0), (3, 30)]
    [remedy] = data["remedies"]
    assert remedy["customer"] == "acme" and remedy["recommendation"]["choice"] == data["frontier"]["overall"][
        "recommendation"]["choice"]
    assert data["frontier"]["overall"]["budget"]["rule"] == "upper"
