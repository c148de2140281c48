"""`frontier` on a sampled remedy matrix stored in a real DuckDB file (tests/sampled_scenario.py): candidates side by
side with their distribution figures, the noise floor as the calibration row and never a remedy, and per customer
the fastest candidate whose shifted-call share passes `--max-shifted-calls` by the one gate rule, else the baseline;
without that budget, which budget to give."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from sampled_scenario import FLOOR, MATRIX, write_sampled_matrix

from analysis.test_sampled import _write_plain_run
from toolaudit.analysis.frontier import BASELINE_CHOICE, Budget, customer_frontiers, frontier
from toolaudit.analysis.rules import Rule
from toolaudit.analysis.sampled import sampled_summary
from toolaudit.cli import cli
from toolaudit.store import Store

ZEPHYR, QUOKKA = "Zephyr Logistics", "Quokka Mutual"


@pytest.fixture(scope="module")
def matrix_db(tmp_path_factory):
    db = tmp_path_factory.mktemp("sampled-matrix") / "m.duckdb"
    with Store(db) as store:
        matrix = write_sampled_matrix(store)
        plain = _write_plain_run(store)
    return {"db": str(db), "matrix": matrix, "plain": plain}


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def _choices(store, matrix: int, budget: Budget) -> dict:
    out = {None: frontier(store, matrix, budget=budget).recommendation.choice}
    out.update({f.customer: f.recommendation.choice for f in customer_frontiers(store, matrix, budget)})
    return out


def test_the_recommendation_is_the_fastest_candidate_within_the_shifted_budget(matrix_db):
    with Store(matrix_db["db"], read_only=True) as store:
        # spec-draft shifts Zephyr's calls only, spec-broken every call: each customer gets its own remedy.
        assert _choices(store, matrix_db["matrix"], Budget(max_shifted_calls=0.4)) == {
            None: "spec-ngram", QUOKKA: "spec-draft", ZEPHYR: "spec-ngram"}
        # Under the floor's own upper bound (0 of 12 calls: 24%) nothing can pass: the baseline.
        tight = frontier(store, matrix_db["matrix"], QUOKKA, Budget(max_shifted_calls=0.1))
        assert tight.recommendation.choice == BASELINE_CHOICE and "no candidate is within budget" in \
            tight.recommendation.reason
        # The same budget on the point estimate passes the candidates with no shifted call: the one rule decides.
        point = frontier(store, matrix_db["matrix"], QUOKKA, Budget(max_shifted_calls=0.1, rule=Rule.POINT))
        assert point.recommendation.choice == "spec-draft"
        # Any budget at all: the floor is the calibration, never a remedy, however it scores.
        loose = frontier(store, matrix_db["matrix"], budget=Budget(max_shifted_calls=1.0))
        assert loose.recommendation.choice == "spec-broken"
        assert FLOOR not in {r.candidate for r in loose.remedies}
        floor = loose.floor
        assert floor.candidate == FLOOR and floor.noise_floor and floor.within_budget is None
        assert floor.pareto is None and not floor.judged
        assert loose.calibration is floor and floor.sampled.shifted.k == 0


def test_each_candidate_carries_the_figures_summary_gives_it(matrix_db):
    with Store(matrix_db["db"], read_only=True) as store:
        f = frontier(store, matrix_db["matrix"], budget=Budget(max_shifted_calls=0.4))
        zephyr = frontier(store, matrix_db["matrix"], ZEPHYR)
        for r in f.remedies:
            s = sampled_summary(store, r.run_id)
            assert (r.sampled.shifted.k, r.sampled.shifted.n) == (s["shifted_calls"], s["calls_tested"])
            assert r.sampled.global_p == s["global_p"] and r.sampled.median_tv == s["median_tv"]
            drop = r.sampled.valid_drop
            valid = s["paired"]["schema_valid_rate"]
            assert drop == pytest.approx((valid["baseline"] - valid["candidate"], -valid["high"], -valid["low"]))
            mine = next(x for x in zephyr.remedies if x.run_id == r.run_id).sampled
            by_customer = {c["customer"]: c for c in s["customers"]}[ZEPHYR]
            assert (mine.shifted.k, mine.shifted.n) == (by_customer["shifted_calls"], by_customer["calls_tested"])
    shifted = {r.candidate: r.sampled.shifted.k for r in f.remedies}
    assert shifted["spec-ngram"] <= 1 and shifted["spec-draft"] >= 10 and shifted["spec-broken"] >= 20
    broken = next(r for r in f.remedies if r.candidate == "spec-broken")
    assert broken.sampled.valid_drop[1] > 0  # a third of the samples lose their tool call
    assert [r.speedup for r in f.remedies] == pytest.approx([s for _, s in MATRIX.values()])
    assert f.floor.speedup == pytest.approx(1.02)


def test_frontier_json_and_text_of_a_sampled_matrix(matrix_db):
    db, matrix = matrix_db["db"], str(matrix_db["matrix"])
    out = invoke("frontier", "--db", db, "--run", matrix, "--max-shifted-calls", "40%", "--as", "json")
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    overall = data["overall"]
    assert overall["sampled"] is True and overall["budget"]["max_shifted_calls"] == 0.4
    assert overall["recommendation"]["choice"] == "spec-ngram" and overall["budget_hint"] is None
    assert overall["calibration"]["candidate"] == FLOOR and overall["calibration"]["shifted_calls"] == 0
    row = overall["remedies"][0]["sampled"]
    assert {"shifted_calls", "calls_tested", "shifted_ci_high", "global_p", "median_tv", "valid_drop",
            "valid_drop_ci_low", "valid_drop_ci_high", "samples_per_call"} <= set(row)
    check = overall["remedies"][0]["budget_checks"][0]
    assert check["name"] == "shifted_calls" and check["rule"] == "upper" and check["threshold"] == 0.4
    assert {c["customer"]: c["recommendation"]["choice"] for c in data["customers"]} == {
        QUOKKA: "spec-draft", ZEPHYR: "spec-ngram"}

    bare = json.loads(invoke("frontier", "--db", db, "--run", matrix, "--as", "json").output)
    for f in [bare["overall"], *bare["customers"]]:
        assert f["recommendation"] is None and "give --max-shifted-calls PCT" in f["budget_hint"]
        assert f"{100 * f['calibration']['shifted_ci_high']:.2f}% on its upper bound" in f["budget_hint"]

    text = invoke("frontier", "--db", db, "--run", matrix, "--max-call-drift", "5%")
    assert text.exit_code == 0, text.output
    assert f"{FLOOR} (noise floor: calibration)" in text.output and "schema-valid drop (95% CI)" in text.output
    assert "no recommendation: --max-call-drift and --max-session-drift are not used on a sampled matrix" in \
        text.output and "give --max-shifted-calls PCT" in text.output


def test_a_shifted_budget_on_a_greedy_run_is_a_usage_error(matrix_db):
    out = invoke("frontier", "--db", matrix_db["db"], "--run", str(matrix_db["plain"]), "--max-shifted-calls", "5%")
    assert out.exit_code == 2 and "--max-shifted-calls: run" in out.output and "not a sampled run" in out.output
    ok = invoke("frontier", "--db", matrix_db["db"], "--run", str(matrix_db["plain"]), "--max-call-drift", "5%")
    assert ok.exit_code == 0 and "recommended: target-only" in ok.output, ok.output  # 0 of 10: upper 27.8%


def test_remedy_reports_of_a_sampled_matrix(matrix_db, tmp_path):
    db, matrix = matrix_db["db"], str(matrix_db["matrix"])
    out = invoke("report", "--db", db, "--run", matrix, "--all-customers", "--write", "md,json", "-o", str(tmp_path),
                 "--max-shifted-calls", "40%", "--json")
    assert out.exit_code == 0, out.output
    printed = json.loads(out.output)
    assert {r["customer"]: r["recommendation"]["choice"] for r in printed["remedies"]} == {
        QUOKKA: "spec-draft", ZEPHYR: "spec-ngram"}
    assert printed["frontier"]["overall"]["recommendation"]["choice"] == "spec-ngram"
    folder = tmp_path / f"run-{matrix}"
    zephyr = json.loads((folder / "zephyr-logistics.json").read_text())
    assert zephyr["frontier"]["sampled"] and zephyr["settings"]["max_shifted_calls"] == 0.4
    assert zephyr["method"].startswith("A sampled matrix")
    md = (folder / "zephyr-logistics.md").read_text()
    assert "| candidate | shifted | 95% CI | global p | median TV | schema-valid drop (95% CI) |" in md
    assert f"`{FLOOR}` (noise floor: calibration)" in md and "**Recommended: spec-ngram" in md
    for text in (md, (folder / "zephyr-logistics.json").read_text()):
        assert "quokka" not in text.lower()  # each candidate's figures on this customer's calls only
    member = json.loads((tmp_path / f"run-{zephyr['candidates'][0]['run_id']}" / "zephyr-logistics.json").read_text())
    assert member["sampled"]["customer"] == ZEPHYR  # each candidate's own report has its distribution tests
    bare = invoke("report", "--db", db, "--run", matrix, "--customer", QUOKKA, "--write", "md", "-o",
                  str(tmp_path / "b"))
    assert bare.exit_code == 0, bare.output
    assert "**No recommendation: a sampled matrix is judged on the share of calls" in \
        (tmp_path / "b" / f"run-{matrix}" / "quokka-mutual.md").read_text()
    plain = invoke("report", "--db", db, "--run", str(matrix_db["plain"]), "--all-customers", "-o", str(tmp_path / "p"),
                   "--max-shifted-calls", "5%")
    assert plain.exit_code == 2 and "is not a sampled matrix" in plain.output
