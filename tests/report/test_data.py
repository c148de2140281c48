"""The report data: per-customer figures, isolation of noise floor and compounding, routing advice, slugs and
noise-floor labels."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from toolaudit.analysis.figures import run_summary
from toolaudit.cli import cli
from toolaudit.report import ReportOptions, customer_report, is_noise_floor, slugs
from toolaudit.report.data import KIND_COLUMNS
from toolaudit.report.text import kinds_text
from toolaudit.store import Store
from toolaudit.store.vocabulary import DRIFTED_KINDS


def _report(db_path: Path, customer: str, **kwargs) -> dict:
    with Store(db_path, read_only=True) as store:
        return customer_report(store, 1, customer, ReportOptions(**kwargs))


def test_figures_per_customer(report_db):
    r = _report(report_db, "Zephyr Logistics")
    h = r["headline"]
    assert (h["calls"], h["drifted_calls"], h["sessions"], h["sessions_with_drift"]) == (18, 4, 6, 4)
    assert h["drift_kinds"] == {"identical": 14, "arguments_changed": 2, "schema_broken": 1,
                                "tool_name_changed": 1}
    base, cand = r["paths"]
    assert base["tokens_per_s"] == pytest.approx(40.0) and cand["tokens_per_s"] == pytest.approx(80.0)
    assert base["acceptance_rate"] is None and cand["acceptance_rate"] == pytest.approx(0.6)
    assert cand["tool_call_mismatch_rate"] == pytest.approx(4 / 18)
    assert (base["fingerprint"], cand["fingerprint"]) == ("fp-target-0001", "fp-spec-0002")
    m = r["margins"]
    assert (m["drifted_calls"], m["with_evidence"], m["near_tie"], m["large_margin"]) == (4, 3, 2, 1)
    assert sum(b["count"] for b in m["histogram"]) == 3
    first = r["examples"][0]
    assert first["attribution"] == "possible decode-path bug" and first["baseline_margin"] == 3.5
    assert first["arg_diffs"][0]["arg_path"] == "limit" and first["arg_diffs"][0]["candidate"] == "50"
    assert r["examples"][1]["drift_kind"] == "schema_broken"  # then schema breaks
    assert r["noise_floor"]["run_id"] == 2 and r["noise_floor"]["drifted_calls"] == 1
    assert r["noise_floor"]["max_drift_margin"] == 0.125
    args = {(a["tool_name"], a["arg_path"]): a for a in r["arguments"]}
    assert set(args) == {("search_tickets", "limit"), ("search_tickets", "query"),
                         ("close_ticket", "ticket_id")}
    assert args[("close_ticket", "ticket_id")]["rate"] == pytest.approx(1 / 6)
    assert args[("search_tickets", "limit")]["example_candidate"] == "50"
    assert len(r["session_length"]) == 10 and r["session_length"][0]["p"] == pytest.approx(4 / 18)


def test_recorded_logs_have_no_speed_and_no_token_evidence(report_db):
    r = _report(report_db, "Walrus Freight")
    assert all(p["tokens_per_s"] is None and p["acceptance_rate"] is None for p in r["paths"])
    assert r["margins"]["with_evidence"] == 0 and r["margins"]["without_evidence"] == 1
    assert r["examples"][0]["attribution"] == "no token evidence"


def test_noise_floor_and_compounding_use_only_the_customers_calls(report_db):
    quokka = _report(report_db, "Quokka Mutual")
    # The noise-floor run drifted on a Zephyr call only: Quokka's noise floor is zero, and Zephyr's margin
    # does not leak into it.
    assert quokka["noise_floor"]["drifted_calls"] == 0 and quokka["noise_floor"]["max_drift_margin"] is None
    # Compounded from Quokka's own per-tool rates: search_tickets 2/12, close_ticket 0/6; every session has
    # two search calls.
    expected = 1 - (1 - 2 / 12) ** 2
    head = quokka["headline"]
    assert head["compounded_session_drift_own_rates"] == pytest.approx(expected)
    assert head["compounded_session_drift"] == head["compounded_session_drift_own_rates"]  # deprecated name
    assert head["compounded_session_drift_run_rates"] != pytest.approx(expected)  # the run-wide rates differ
    assert quokka["headline"]["error_calls"] == 1 and quokka["headline"]["calls"] == 18
    assert [p["errors"] for p in quokka["paths"]] == [0, 1]


def test_the_two_compounded_figures_keep_their_names_in_the_view_summary_and_report(report_db):
    """The run-rates figure reads the same in `customer_drift`, `summary --json` and the report (bit for bit);
    the report's own-rates figure differs from it for some customer; the old names are the old figures."""
    with Store(report_db, read_only=True) as store:
        rows = store.rows("SELECT * FROM customer_drift WHERE run_id = 1 ORDER BY customer")
        summary = {c["customer"]: c for c in run_summary(store, 1)["customers"]}
        heads = {row["customer"]: customer_report(store, 1, row["customer"])["headline"] for row in rows}
    for row in rows:
        head, mine = heads[row["customer"]], summary[row["customer"]]
        assert row["compounded_session_drift_run_rates"] == head["compounded_session_drift_run_rates"] == \
            mine["compounded_session_drift_run_rates"]
        assert row["compounded_session_drift"] == mine["compounded_session_drift"] == \
            row["compounded_session_drift_run_rates"]
        assert head["compounded_session_drift"] == head["compounded_session_drift_own_rates"]
    assert any(h["compounded_session_drift_own_rates"] != h["compounded_session_drift_run_rates"]
               for h in heads.values())


def test_routing_advice(report_db):
    r = _report(report_db, "Zephyr Logistics", max_call_drift=0.5, max_session_drift=0.99, session_calls=3)
    rows = {a["scope"]: a for a in r["routing"]["rows"]}
    assert r["routing"]["session_calls"] == 3
    overall = rows["all tools"]
    assert overall["calls"] == 18 and overall["verdict"] == "candidate ok"
    assert overall["session_upper"] == pytest.approx(1 - (1 - overall["ci_high"]) ** 3)
    tight = _report(report_db, "Zephyr Logistics", max_call_drift=0.01)
    verdicts = {a["scope"]: (a["verdict"], a["reason"]) for a in tight["routing"]["rows"]}
    assert verdicts["all tools"] == ("target-only", "drift over budget")
    assert _report(report_db, "Walrus Freight")["routing"] is None



def test_slugs_and_noise_floor_labels(report_db, tmp_path):
    names = slugs(["Acme Corp", "acme-corp", "Globex", "../../etc", "!!!"])
    assert names["Globex"] == "globex" and names["../../etc"] == "etc"
    assert names["Acme Corp"] != names["acme-corp"] and names["Acme Corp"].startswith("acme-corp-")
    assert re.fullmatch(r"customer-[0-9a-f]{6}", names["!!!"])
    assert is_noise_floor({"baseline_name": "t", "candidate_name": "t", "options": None})
    assert is_noise_floor({"baseline_name": "a", "candidate_name": "b", "options": '{"noise_floor": true}'})
    assert not is_noise_floor({"baseline_name": "a", "candidate_name": "b", "options": "{}"})
    out = tmp_path / "r"
    result = CliRunner().invoke(cli, ["report", "--db", str(report_db), "--run", "2", "--customer",
                                      "Quokka Mutual", "--write", "json", "-o", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "run-2" / "quokka-mutual.json").read_text())
    assert data["run"]["noise_floor_run"] is True and data["noise_floor"] is None


def test_tool_rows_carry_the_drifted_kinds_in_display_order(report_db):
    # The JSON keys and the "kinds" text follow records' display order; a reorder there changes the output.
    assert KIND_COLUMNS == ("arguments_changed", "schema_broken", "tool_name_changed", "call_count_changed",
                            "unparseable")
    assert set(KIND_COLUMNS) == {str(k) for k in DRIFTED_KINDS}
    for row in _report(report_db, "Zephyr Logistics")["tools"]:
        assert list(row)[3:3 + len(KIND_COLUMNS)] == list(KIND_COLUMNS)
    assert kinds_text({"unparseable": 1, "schema_broken": 0, "arguments_changed": 2}) == \
        "arguments changed 2, unparseable 1"
