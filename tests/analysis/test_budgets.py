"""`toolaudit check`: exit codes and the exact message of each bound, regressions against an earlier run,
fingerprint expectations, and the routing advice behind reports."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from conftest import line, tool_call, write_jsonl

from toolaudit.analysis.budgets import changed_components, parse_proportion, session_upper
from toolaudit.analysis.routing import routing_advice
from toolaudit.analysis.stats import wilson
from toolaudit.cli import cli
from toolaudit.compare.logs import CompareOptions, compare_logs
from toolaudit.store import Store

COMPONENTS_V1 = {"engine": "torch", "dtype": "bfloat16", "torch": "2.13.0",
                 "speculative": {"method": "ngram", "num_speculative_tokens": 5}}
COMPONENTS_V2 = {"engine": "torch", "dtype": "float32", "torch": "2.13.0",
                 "speculative": {"method": "ngram", "num_speculative_tokens": 3}}


def _run(tmp_path, store: Store, drifted: int, name: str, calls: int = 1000, bad_lines: int = 0) -> int:
    """`calls` calls in sessions of 5; the first `drifted` sessions get one drifted call each; `bad_lines`
    unreadable candidate lines (error rows)."""
    base, cand = [], []
    for i in range(calls):
        session = f"s{i // 5:03d}"
        base.append(line(session=session, calls=[tool_call("search_tickets", {"query": "q", "limit": 5})]))
        limit = 50 if i % 5 == 0 and i // 5 < drifted else 5
        args = {"query": "q", "limit": limit}
        cand.append(line(session=session, calls=[tool_call("search_tickets", args)]))
    cand += ["not json"] * bad_lines
    b = write_jsonl(tmp_path / f"{name}-b.jsonl", base)
    c = write_jsonl(tmp_path / f"{name}-c.jsonl", cand)
    run_id, _ = compare_logs(store, b, c, CompareOptions(schema_dir=None, run_name=name))
    return run_id


@pytest.fixture(scope="module")
def gate_db(tmp_path_factory):
    """Run 1: 12/1000 drifted (1.2%); run 2: 21/1000 (2.1%); run 3: 40/1000 (4.0%), all on the same calls;
    fingerprints with stored components on runs 1 and 2."""
    tmp_path = tmp_path_factory.mktemp("gate")
    db_path = tmp_path / "gate.duckdb"
    with Store(db_path) as store:
        assert _run(tmp_path, store, 12, "before") == 1
        assert _run(tmp_path, store, 21, "after") == 2
        assert _run(tmp_path, store, 40, "worse") == 3
        for run_id, fp, comps in ((1, "fp-aaaa1111bbbb", COMPONENTS_V1),
                                  (2, "fp-cccc2222dddd", COMPONENTS_V2)):
            store.con.execute("UPDATE runs SET candidate_fingerprint = ?, options = ? WHERE run_id = ?",
                              [fp, json.dumps({"candidate_fingerprint_components": comps}), run_id])
    return str(db_path)


def check(db: str, *args: str):
    return CliRunner().invoke(cli, ["check", "--db", db, *args])


UPPER = ("rule: upper bound of the 95% Wilson interval: fails unless the data show the budget is met "
         "(--rule point or --rule lower to change)")
POINT = ("rule: point estimate: fails when the measured rate is over the budget "
         "(--rule upper or --rule lower to change)")
LOWER = ("rule: lower bound of the 95% Wilson interval: fails only when the data show the budget is exceeded "
         "(--rule upper or --rule point to change)")
AGAINST = ("rule (--against): the rise fails when its 95% interval (Newcombe) lies above 0 and the point rise is "
           "over --max-increase")


def test_call_drift_bound_on_the_default_rule(gate_db):
    """The default judges the 95% upper bound: 1.20% of 1000 calls cannot show it is within 1.5% (upper 2.09%)."""
    result = check(gate_db, "--run", "1", "--max-call-drift", "1.5%")
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        "call drift upper bound 2.09% > max 1.50% (point 1.20%, 95% CI 0.69%-2.09%)", UPPER]
    result = check(gate_db, "--run", "1", "--max-call-drift", "2.5%")
    assert result.exit_code == 0
    assert result.output.splitlines() == [
        "ok: run 1: 12/1000 calls drifted (1.20%, 95% CI 0.69%-2.09%), 12/200 sessions; call drift upper bound "
        "2.09% <= max 2.50% (point 1.20%, 95% CI 0.69%-2.09%); no error rows", UPPER]


def test_point_rule(gate_db):
    result = check(gate_db, "--run", "2", "--max-call-drift", "1.5%", "--rule", "point")
    assert result.exit_code == 1
    assert result.output.splitlines() == ["call drift 2.10% > max 1.50% (95% CI 1.38%-3.19%)", POINT]
    result = check(gate_db, "--run", "1", "--max-call-drift", "0.015", "--rule", "point")
    assert result.exit_code == 0
    assert result.output.splitlines()[0] == (
        "ok: run 1: 12/1000 calls drifted (1.20%, 95% CI 0.69%-2.09%), 12/200 sessions; "
        "call drift 1.20% <= max 1.50% (95% CI 0.69%-2.09%); no error rows")
    assert check(gate_db, "--run", "1", "--max-call-drift", "1.2%", "--rule", "point").exit_code == 0  # equal: in


def test_lower_rule_fails_only_when_the_data_show_the_budget_is_exceeded(gate_db):
    # run 2: 2.10%, 95% CI 1.38%-3.19%: over 1.5% on its point, but not shown to be over it
    result = check(gate_db, "--run", "2", "--max-call-drift", "1.5%", "--rule", "lower")
    assert result.exit_code == 0 and result.output.splitlines()[-1] == LOWER
    assert "call drift lower bound 1.38% <= max 1.50% (point 2.10%, 95% CI 1.38%-3.19%)" in result.output
    result = check(gate_db, "--run", "3", "--max-call-drift", "1.5%", "--rule", "lower")
    assert result.exit_code == 1
    assert result.output.splitlines()[0] == "call drift lower bound 2.95% > max 1.50% (point 4.00%, 95% CI 2.95%-5.40%)"


def test_use_upper_bound_is_the_older_spelling_of_rule_upper(gate_db):
    args = ("--run", "1", "--max-call-drift", "1.5%")
    default, old, new = check(gate_db, *args), check(gate_db, *args, "--use-upper-bound"), \
        check(gate_db, *args, "--rule", "upper")
    assert default.exit_code == old.exit_code == new.exit_code == 1
    assert default.output == old.output == new.output
    conflict = check(gate_db, *args, "--use-upper-bound", "--rule", "point")
    assert conflict.exit_code == 2 and "--use-upper-bound means --rule upper" in conflict.output


def test_session_drift_bound(gate_db):
    """Sessions are judged on the session drift the per-call figure implies at 5 calls per session."""
    result = check(gate_db, "--run", "1", "--max-session-drift", "5%")
    assert session_upper(wilson(12, 1000).high, 5) == pytest.approx(0.1000259, abs=1e-7)
    assert result.exit_code == 1
    assert result.output.splitlines()[0] == ("session drift upper bound (5.0 calls/session) 10.00% > max 5.00% "
                                             "(point 5.86%, 95% CI 3.39%-10.00%)")
    result = check(gate_db, "--run", "1", "--max-session-drift", "5%", "--rule", "point")
    assert result.exit_code == 1 and result.output.startswith("session drift (5.0 calls/session) 5.86% > max 5.00%")
    result = check(gate_db, "--run", "1", "--max-session-drift", "6%", "--rule", "point")
    assert result.exit_code == 0 and "session drift (5.0 calls/session) 5.86% <= max 6.00%" in result.output
    shorter = check(gate_db, "--run", "1", "--max-session-drift", "5%", "--session-calls", "2")
    assert shorter.exit_code == 0, shorter.output  # 1 - (1 - 2.09%)^2 = 4.13%
    assert "session drift upper bound (2.0 calls/session) 4.13% <= max 5.00%" in shorter.output
    alone = check(gate_db, "--max-call-drift", "5%", "--session-calls", "2")
    assert alone.exit_code == 2 and "--session-calls needs --max-session-drift" in alone.output


def test_a_rise_fails_only_when_significant_and_over_the_allowed_increase(gate_db):
    # 1.20% -> 2.10% of 1000 calls: over 0.5pp, but the difference's interval includes 0: not a regression
    result = check(gate_db, "--run", "2", "--against", "1", "--max-increase", "0.5pp")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[1:] == [AGAINST]
    assert ("; call drift rose 0.90pp vs run 1 (1.20% of 1000 -> 2.10% of 1000 calls; 95% CI of the difference "
            "-0.24pp to +2.10pp): not significant (the interval includes 0); 0.90pp > max increase 0.50pp; "
            in result.output)
    # 1.20% -> 4.00%: significant, and over 0.5pp
    result = check(gate_db, "--run", "3", "--against", "1", "--max-increase", "0.5pp")
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        "call drift rose 2.80pp vs run 1 (1.20% of 1000 -> 4.00% of 1000 calls; 95% CI of the difference +1.43pp "
        "to +4.29pp): significant and > max increase 0.50pp", AGAINST]
    # the same rise allowed by a larger --max-increase: significant but within it
    result = check(gate_db, "--run", "3", "--against", "1", "--max-increase", "3pp")
    assert result.exit_code == 0 and "significant and <= max increase 3.00pp" in result.output
    result = check(gate_db, "--run", "1", "--against", "3", "--max-increase", "0")
    assert result.exit_code == 0 and "call drift fell 2.80pp vs run 3 (4.00% of 1000 -> 1.20% of 1000 calls; " \
        "95% CI of the difference -4.29pp to -1.43pp): no increase" in result.output
    assert "different inputs" not in result.output  # the same calls: no warning


def test_every_violation_gets_a_line(gate_db):
    result = check(gate_db, "--run", "3", "--max-call-drift", "1.5%", "--max-session-drift", "0.1", "--against",
                   "1", "--max-increase", "0.005", "--rule", "point")
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        "call drift 4.00% > max 1.50% (95% CI 2.95%-5.40%)",
        "session drift (5.0 calls/session) 18.46% > max 10.00% (95% CI 13.91%-24.24%)",
        "call drift rose 2.80pp vs run 1 (1.20% of 1000 -> 4.00% of 1000 calls; 95% CI of the difference +1.43pp "
        "to +4.29pp): significant and > max increase 0.50pp",
        POINT,
        AGAINST,
    ]


def test_fingerprint(gate_db):
    result = check(gate_db, "--run", "2", "--expect-fingerprint", "fp-cccc2222dddd")
    assert result.exit_code == 0 and "candidate fingerprint fp-cccc2222dddd matches" in result.output
    assert check(gate_db, "--run", "2", "--expect-fingerprint", "fp-cccc2222").exit_code == 0  # 8+ char prefix
    result = check(gate_db, "--run", "2", "--expect-fingerprint", "fp-aaaa1111bbbb")
    assert result.exit_code == 1
    assert result.output == ("candidate fingerprint fp-cccc2222dddd != expected fp-aaaa1111bbbb; changed "
                             "since run 1: dtype (bfloat16 -> float32), "
                             "speculative.num_speculative_tokens (5 -> 3)\n")  # no rule line: no budget
    result = check(gate_db, "--run", "2", "--expect-fingerprint", "fp-unknown")
    assert result.exit_code == 1
    assert result.output == "candidate fingerprint fp-cccc2222dddd != expected fp-unknown\n"


def test_usage_errors_exit_2(gate_db, tmp_path):
    result = check(gate_db, "--max-call-drift", "1%", "--rule", "median")
    assert result.exit_code == 2 and "'median' is not one of 'upper', 'point', 'lower'" in result.output
    result = check(gate_db)
    assert result.exit_code == 2 and "no bound given; pass --max-call-drift" in result.output
    result = check(gate_db, "--max-increase", "0.5pp")
    assert result.exit_code == 2 and "--max-increase needs --against RUN" in result.output
    result = check(gate_db, "--against", "1")
    assert result.exit_code == 2 and "--against needs --max-increase PP" in result.output
    result = check(gate_db, "--max-call-drift", "lots")
    assert result.exit_code == 2 and "'lots' is not a proportion; use 0.015 or 1.5%" in result.output
    result = check(gate_db, "--max-call-drift", "150%")
    assert result.exit_code == 2 and "'150%' is outside 0..1 (0%..100%)" in result.output
    result = check(gate_db, "--run", "9", "--max-call-drift", "1%")
    assert result.exit_code == 2 and "no run with id 9" in result.output
    result = check(gate_db, "--against", "9", "--max-increase", "1%")
    assert result.exit_code == 2 and "no run with id 9" in result.output
    result = check(str(tmp_path / "missing.duckdb"), "--max-call-drift", "1%")
    assert result.exit_code == 2 and "no such database" in result.output


def test_run_without_matched_calls_cannot_pass(tmp_path, db_path):
    call = [tool_call("close_ticket", {"ticket_id": 1})]
    b = write_jsonl(tmp_path / "b.jsonl", [line(session="only-in-baseline", calls=call)])
    c = write_jsonl(tmp_path / "c.jsonl", [line(session="only-in-candidate", calls=call)])
    with Store(db_path) as store:
        compare_logs(store, b, c, CompareOptions(schema_dir=None))
    result = check(str(db_path), "--max-call-drift", "1%")
    assert result.exit_code == 2 and "run 1 has no matched calls; nothing to check" in result.output


def test_parse_proportion():
    assert parse_proportion("0.015") == 0.015 and parse_proportion("1.5%") == 0.015
    assert parse_proportion(" 1.5 % ") == 0.015 and parse_proportion("0") == 0.0
    assert parse_proportion("0.5pp", points=True) == 0.005 and parse_proportion("0.5%", points=True) == 0.005
    for bad in ("", "abc", "-1%", "1.5", "nan", "inf", "0.5pp"):
        with pytest.raises(ValueError):
            parse_proportion(bad)


def test_changed_components():
    assert changed_components(COMPONENTS_V1, COMPONENTS_V2) == [
        ("dtype", "bfloat16", "float32"), ("speculative.num_speculative_tokens", 5, 3)]
    assert changed_components({"a": 1}, {"b": 1}) == [("a", 1, None), ("b", None, 1)]


def test_routing_advice():
    # 12/1000: upper bound 2.09%, so a 2.5% budget holds and a 1.5% budget does not, though 1.2% < 1.5%
    ok = routing_advice("all tools", wilson(12, 1000), 0.025, None, 5)
    assert (ok.verdict, ok.within_call_budget, ok.reason) == ("candidate ok", True,
                                                              "95% upper bound within budget")
    unproven = routing_advice("all tools", wilson(12, 1000), 0.015, None, 5)
    assert unproven.verdict == "target-only"
    assert unproven.reason == "not enough calls to show it is within budget"
    over = routing_advice("search", wilson(30, 1000), 0.015, None, 5)
    assert (over.verdict, over.reason) == ("target-only", "drift over budget")
    # sessions of 5: 1 - (1 - 2.0857%)^5 = 10.0026%, just over a 10% budget though the point estimate is 5.9%
    sessions = routing_advice("all tools", wilson(12, 1000), None, 0.11, 5)
    assert sessions.verdict == "candidate ok" and sessions.session_upper == pytest.approx(0.1000259, abs=1e-7)
    tight = routing_advice("all tools", wilson(12, 1000), None, 0.10, 5)
    assert (tight.verdict, tight.reason) == ("target-only", "not enough calls to show it is within budget")
    assert routing_advice("none", wilson(0, 0), 0.5, None, 5).reason == "no calls measured"
