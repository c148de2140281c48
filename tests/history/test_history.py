"""`toolaudit history`: one row per run over time, its figures, and what changed since the previous run of the
path pair (config components, probe decisions, probe numerics); a customer's history from its calls only."""

from __future__ import annotations

import csv
import io
import json

from click.testing import CliRunner

from toolaudit.analysis.history import history
from toolaudit.analysis.stats import wilson
from toolaudit.cli import cli
from toolaudit.store import Store

from .scenario import CALLS


def _rows(db, **kwargs):
    with Store(db, read_only=True) as store:
        h = history(store, **kwargs)
    return h, {r.run_id: r.as_dict() for r in h.rows}


def test_each_run_with_its_figures_oldest_first(history_db):
    db, ids = history_db
    h, rows = _rows(db, path_pair=("target", "spec-ngram"), budget=0.02)
    # matrix rows hold no calls and the noise floor is a column, not a row; the other pairs are not asked for
    assert [r.run_id for r in h.rows] == [*ids.nights, ids.matrix_candidate, ids.globex_only]
    assert [(s.baseline, s.candidate) for s in h.series] == [("target", "spec-ngram")]
    five = rows[ids.nights[4]]
    rate = wilson(12, CALLS)
    assert (five["calls"], five["drifted_calls"]) == (CALLS, 12)
    assert (five["drift_rate"], five["ci_low"], five["ci_high"]) == (rate.p, rate.low, rate.high)
    # one tool, sessions of two calls: compounded session drift is 1 - (1 - p)^2
    assert abs(five["session_drift"] - (1 - (1 - 12 / CALLS) ** 2)) < 1e-12
    assert five["acceptance_rate"] == 0.6
    assert abs(five["candidate_tokens_per_s"] - 64.0) < 1e-9 and abs(five["baseline_tokens_per_s"] - 40.0) < 1e-9
    assert abs(five["speedup"] - 1.6) < 1e-9
    # the gate's rule on the budget: 1/400 has an upper bound of 1.40% (within 2%), 12/400 of 5.17%
    assert rows[ids.nights[0]]["within_budget"] is True and five["within_budget"] is False
    assert {r["budget"] for r in rows.values()} == {0.02}
    # the matrix candidate beside its noise floor: the floor drifted on 5 calls, all also drifted on the candidate
    member = rows[ids.matrix_candidate]
    assert member["floor_run_id"] == ids.floor and member["floor_drift_rate"] == 5 / CALLS
    assert member["excess"] == 4 / CALLS
    assert rows[ids.nights[0]]["floor_drift_rate"] is None
    # asked for, the floor's own pair is there; unasked, it is a column, not a row
    floor_pair, _ = _rows(db, path_pair=("target", "target-b1"))
    assert [r.run_id for r in floor_pair.rows] == [ids.floor]
    every, _ = _rows(db)
    assert ids.floor not in {r.run_id for r in every.rows} and ids.matrix not in {r.run_id for r in every.rows}
    # the jump to night 5 is beyond noise, the one before it is not
    assert five["drift_change_low"] > 0 and rows[ids.nights[3]]["drift_change_low"] < 0


def test_the_change_that_explains_each_jump(history_db):
    db, ids = history_db
    _, rows = _rows(db, path_pair=("target", "spec-ngram"))
    one, two, three, four, five = (rows[i] for i in ids.nights)
    assert one["previous_run_id"] is None and one["change"] == "first run of this path pair"
    # night 1 stored fingerprints only: the new torch shows as a config change without its components
    assert two["previous_run_id"] == ids.nights[0]
    assert [(c["kind"], c["side"], c["components_recorded"]) for c in two["changes"]] == [
        ("config", "candidate", False), ("config", "baseline", False)]
    assert "config changed (components not recorded)" in two["change"]
    assert three["changes"] == [] and three["change"] == "no recorded change"
    # same config, other logprobs from the candidate's runtime
    assert [(c["kind"], c["side"]) for c in four["changes"]] == [("numerics", "candidate")]
    assert (four["config_changed"], four["decisions_changed"], four["numerics_changed"]) == (False, False, True)
    assert four["change"] == "candidate spec-ngram: probe numerics changed (other logprobs, same tokens)"
    # k 4 -> 8, named, and the greedy choices moved with it
    assert [(c["kind"], c["side"]) for c in five["changes"]] == [("config", "candidate"), ("decisions", "candidate")]
    assert five["changes"][0]["components"] == [
        {"component": "speculative.num_speculative_tokens", "before": 4, "after": 8}]
    assert five["change"] == ("candidate spec-ngram: config speculative.num_speculative_tokens 4 -> 8, probe "
                              "decisions changed (other greedy tokens)")
    # the matrix recorded the baseline's probe with the matrix run: its numerics moved, nothing else did
    member = rows[ids.matrix_candidate]
    assert member["previous_run_id"] == ids.nights[4]
    assert [(c["kind"], c["side"]) for c in member["changes"]] == [("numerics", "baseline")]
    assert member["baseline_probe_numerics"] is not None and member["candidate_probe_decisions"] is not None
    assert rows[ids.globex_only]["changes"] == []


def test_a_customers_history_reads_only_its_calls(history_db):
    db, ids = history_db
    h, rows = _rows(db, path_pair=("target", "spec-ngram"), customer="acme")
    assert ids.globex_only not in rows  # a night without acme's calls is not in acme's history
    assert {r["calls"] for r in rows.values()} == {CALLS // 2}
    assert rows[ids.nights[4]]["drifted_calls"] == 10  # night 5's two globex drifts are not acme's
    assert rows[ids.matrix_candidate]["floor_drift_rate"] == 5 / (CALLS // 2)
    assert "globex" not in json.dumps(h.as_dict(), default=str)
    _, theirs = _rows(db, path_pair=("target", "spec-ngram"), customer="globex")
    assert theirs[ids.nights[4]]["drifted_calls"] == 2
    assert theirs[ids.globex_only]["previous_run_id"] == ids.matrix_candidate


def test_cli_table_json_and_csv(history_db):
    db, ids = history_db
    run = CliRunner().invoke
    table = run(cli, ["history", "--db", str(db), "--budget", "2%"])
    assert table.exit_code == 0, table.output
    assert "target vs spec-ngram: 7 runs; budget 2.00% (--budget)" in table.output
    assert "prod vs canary: 1 run" in table.output and "target vs spec-draft: 1 run" in table.output
    line = next(x for x in table.output.splitlines() if x.startswith(f"{ids.nights[4]} "))
    assert "3.00%" in line and "+2.25pp*" in line and "over" in line
    assert line.endswith("candidate spec-ngram: config speculative.num_speculative_tokens 4 -> 8, probe decisions "
                         "changed (other greedy tokens)")  # the words are never cut
    out = run(cli, ["history", "--db", str(db), "--path-pair", "target", "spec-ngram", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["budget"] is None and [r["run_id"] for r in data["series"][0]["rows"]][:2] == ids.nights[:2]
    got = run(cli, ["history", "--db", str(db), "--csv"])
    assert got.exit_code == 0, got.output
    table_rows = list(csv.DictReader(io.StringIO(got.output)))
    assert list(table_rows[0]) == list(data["series"][0]["rows"][0])  # every column
    assert [int(r["run_id"]) for r in table_rows] == sorted(int(r["run_id"]) for r in table_rows)
    five = next(r for r in table_rows if int(r["run_id"]) == ids.nights[4])
    assert five["decisions_changed"] == "true" and json.loads(five["changes"])[0]["kind"] == "config"
    # the oldest night was timed before each path was charged its own prefill: its tok/s is marked, and said why
    charged = {r["run_id"]: r["prefill_charged"] for r in data["series"][0]["rows"]}
    assert charged[ids.nights[0]] is False and charged[ids.nights[4]] is True
    first = next(x for x in table.output.splitlines() if x.startswith(f"{ids.nights[0]} "))
    assert "64.0+" in first and "64.0+" not in line and "64.0" in line
    assert "tok/s+: a run before each path was charged its own prompts' prefill" in table.output


def test_cli_unknown_pair_or_customer_names_what_there_is(history_db):
    db, _ = history_db
    missing = CliRunner().invoke(cli, ["history", "--db", str(db), "--path-pair", "target", "spec-eagle"])
    assert missing.exit_code == 2
    assert "no runs of target vs spec-eagle" in missing.output and "target spec-ngram" in missing.output
    nobody = CliRunner().invoke(cli, ["history", "--db", str(db), "--customer", "initech"])
    assert nobody.exit_code == 2 and "customer 'initech'" in nobody.output


def test_probes_compare_on_the_same_probe_set_and_fingerprints_only_when_both_runs_have_them(tmp_path):
    """A new probe set is no runtime change; a stand-alone probe (no run) belongs to no run; a run of recorded logs
    (no fingerprints) has no config to compare; equal fingerprints with other probes: the runtime moved alone."""
    import datetime as dt

    from toolaudit.engines.fingerprint import fingerprint
    from toolaudit.store import RowBuffer

    from .scenario import BASE, CAND4

    db = tmp_path / "probes.duckdb"
    fps = (fingerprint(BASE), fingerprint(CAND4))
    comps = {"baseline_fingerprint_components": BASE, "candidate_fingerprint_components": CAND4}
    plan = [(fps, "set-1", "d1"), (fps, "set-2", "d2"), (fps, "set-2", "d3"), ((None, None), "set-2", "d3"),
            (fps, "set-2", "d3")]
    with Store(db) as store:
        ids = []
        for n, ((base_fp, cand_fp), probe_set, decisions) in enumerate(plan):
            run_id = store.create_run("replay", "nightly", "target", "spec-ngram", "", "",
                                      comps if base_fp else {}, base_fp, cand_fp)
            rows = RowBuffer()
            rows.add("calls", run_id=run_id, session_id="s", call_index=0, customer="acme",
                     tool_name="search_tickets", match_status="matched", drift_kind="identical", drifted=False,
                     exact_text_match=True)
            for probe_id, probe_run in ((2 * n + 1, run_id), (2 * n + 2, None)):  # the second: stand-alone
                rows.add("probes", probe_id=probe_id, created_at=dt.datetime(2026, 6, 1 + n), run_id=probe_run,
                         side="candidate" if probe_run else None, path_name="spec-ngram", engine="torch",
                         config_fingerprint=cand_fp or "fp-x", probe_set=probe_set, prompts=32, repeats=2,
                         decisions=decisions if probe_run else "other", numerics="n1", stable=True)
            store.write_rows(rows)
            store.finish_run(run_id, {})
            ids.append(run_id)
    _, rows = _rows(db)
    assert [rows[i]["changes"] for i in ids[:2]] == [[], []]  # the first; then a new probe set: not comparable
    assert [c["kind"] for c in rows[ids[2]]["changes"]] == ["decisions"]  # same config, other greedy tokens
    assert rows[ids[3]]["changes"] == [] and rows[ids[4]]["changes"] == []  # no fingerprints to compare; same tokens
