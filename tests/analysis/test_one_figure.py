"""One figure, one value: every command's JSON gives the same tokens/s, acceptance, drift and calls per session
for the same run and customer, and the noise floor is never a candidate.

One real replay on the tiny model (n-gram speculation against the target, with its noise floor), of the first 2
calls of each demo session, so the sessions as replayed (<= 2 calls) differ from the sessions as recorded: both
lengths must be there, named apart, with the same values in every view."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from toolaudit.cli import cli

SHARED = ("baseline_tokens_per_s", "candidate_tokens_per_s", "acceptance_rate", "speedup")


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    from conftest import REPO
    from helpers import build_tiny_model

    tmp = tmp_path_factory.mktemp("one-figure")
    model = build_tiny_model(tmp / "tiny")
    table = (f'engine = "torch"\nmodel = "{model}"\ndtype = "float32"\nbatch_size = 4\nmax_tokens = 8\n'
             'stop = ["e", "a", "\\n"]\n')
    paths = tmp / "paths.toml"
    paths.write_text(f"[paths.tiny]\n{table}\n[paths.tiny-spec]\n{table}speculative = {{ method = \"ngram\", "
                     "num_speculative_tokens = 3 }\n")
    db = str(tmp / "one.duckdb")
    made = CliRunner().invoke(cli, ["replay", str(REPO / "traces" / "demo.jsonl"), "--paths", str(paths),
                                    "--baseline", "tiny", "--candidate", "tiny-spec", "--noise-floor",
                                    "--calls-per-session", "2", "--limit", "40", "--chunk", "20", "--db", db])
    assert made.exit_code == 0, made.output
    return db, tmp


def same(a: dict, b: dict) -> bool:
    """Equal figures: both absent (None), or equal up to float rounding."""
    return a.keys() == b.keys() and all((a[k] is None) == (b[k] is None) and (a[k] is None or a[k] == pytest.approx(
        b[k])) for k in a)


def _json(*args) -> dict:
    out = CliRunner().invoke(cli, [*args])
    assert out.exit_code == 0, out.output
    return json.loads(out.output)


def test_every_view_gives_one_value_per_figure(replayed):
    db, tmp = replayed
    summary = _json("summary", "--run", "2", "--json", "--db", db)
    frontier = _json("frontier", "--run", "2", "--json", "--db", db)
    history = _json("history", "--json", "--db", db)
    sides = {p["side"]: p for p in summary["paths"]}
    run = {"baseline_tokens_per_s": sides["baseline"]["tokens_per_s"],
           "candidate_tokens_per_s": sides["candidate"]["tokens_per_s"],
           "acceptance_rate": sides["candidate"]["acceptance_rate"], "speedup": summary["speedup"]}
    assert run["candidate_tokens_per_s"] and run["baseline_tokens_per_s"]
    (remedy,) = frontier["overall"]["remedies"]
    (row,) = [r for s in history["series"] for r in s["rows"] if r["run_id"] == 2]
    for view in (remedy, row):
        assert same({k: view[k] for k in SHARED}, run)
        assert (view["calls"], view["drifted_calls"]) == (summary["calls"], summary["drifted_calls"])
        assert view["drift_rate"] == pytest.approx(summary["drift_rate"])
        for length in ("calls_per_session_replayed", "calls_per_session_recorded"):
            assert view[length] == pytest.approx(summary[length])
    assert summary["calls_per_session_recorded"] > summary["calls_per_session_replayed"]  # named apart
    assert remedy["session_calls_source"] == "recorded"
    assert remedy["session_calls"] == pytest.approx(summary["calls_per_session_recorded"])

    # per customer: the frontier's customer rows, the customer's history and its report agree
    for c in summary["customers"]:
        name = c["customer"]
        (f,) = next(x for x in frontier["customers"] if x["customer"] == name)["remedies"]
        (h,) = [r for s in _json("history", "--customer", name, "--json", "--db", db)["series"]
                for r in s["rows"] if r["run_id"] == 2]
        report = _json("report", "--run", "2", "--customer", name, "--write", "json", "-o", str(tmp / "r"), "--json",
                       "--db", db)
        head = report["customers"][0]["headline"]
        for view in (f, h, head):
            assert same({k: view[k] for k in SHARED}, {k: f[k] for k in SHARED})
            assert (view["calls"], view["drifted_calls"]) == (c["calls"], c["drifted_calls"])
            assert view["calls_per_session_replayed"] == pytest.approx(c["calls_per_session_replayed"])
            assert view["calls_per_session_recorded"] == pytest.approx(c["calls_per_session_recorded"])


def test_the_floor_is_never_a_candidate(replayed):
    db, _ = replayed
    frontier = _json("frontier", "--run", "1", "--max-call-drift", "100%", "--json", "--db", db)
    for f in (frontier["overall"], *frontier["customers"]):
        assert [r["candidate"] for r in f["remedies"]] == ["tiny-spec"]
        assert f["noise_floor"]["candidate"] == "tiny-floor" and f["noise_floor"]["within_budget"] is None
        assert f["recommendation"]["choice"] in ("tiny-spec", "target-only")
    gate = CliRunner().invoke(cli, ["check", "--run", "1", "--max-call-drift", "100%", "--json", "--db", db])
    assert [r["candidate"] for r in json.loads(gate.output)["runs"]] == ["tiny-spec"]
    floor = CliRunner().invoke(cli, ["check", "--run", "3", "--max-call-drift", "100%", "--db", db])
    assert floor.exit_code == 0 and "(a noise floor): what differs is batching noise" in floor.output


def test_the_floor_is_no_pareto_point_in_any_view(replayed):
    """The floor is often faster than the baseline (a larger batch) and drifts less than a candidate: as a point
    it would beat the candidate. It is a reference: `pareto` NULL in the SQL views and in `--json`, and the
    candidate's `pareto` the same in both, as if the floor were not there."""
    db, _ = replayed
    frontier = _json("frontier", "--run", "1", "--json", "--db", db)["overall"]
    assert frontier["noise_floor"]["pareto"] is None
    rows = _json("sql", "SELECT candidate, noise_floor, pareto, speedup, drift_rate FROM frontier ORDER BY run_id",
                 "--json", "--db", db)
    rows = rows["rows"] if isinstance(rows, dict) else rows
    by_name = {r["candidate"]: r for r in rows}
    assert by_name["tiny-floor"]["noise_floor"] is True and by_name["tiny-floor"]["pareto"] is None
    assert by_name["tiny-spec"]["noise_floor"] is False
    assert by_name["tiny-spec"]["pareto"] == frontier["remedies"][0]["pareto"]
    drift, speed = by_name["tiny-spec"]["drift_rate"], by_name["tiny-spec"]["speedup"]
    alone = speed is not None and not (speed <= 1 and (drift > 0 or speed < 1))
    assert by_name["tiny-spec"]["pareto"] == alone  # the one candidate: optimal unless the baseline beats it


def test_check_gates_the_excess_over_the_floor(replayed):
    db, _ = replayed
    summary = _json("summary", "--run", "2", "--json", "--db", db)
    high = summary["noise_floor"]["excess"]["high"]
    wide = CliRunner().invoke(cli, ["check", "--run", "2", "--max-excess", f"{100 * high + 0.01:.2f}pp", "--json",
                                    "--db", db])
    assert wide.exit_code == 0, wide.output  # within the budget on the excess's upper bound
    (excess,) = [c for c in json.loads(wide.output)["runs"][0]["checks"] if c["name"] == "excess"]
    assert excess["figure"] == pytest.approx(high) and excess["ok"]
    if high > 0:
        tight = CliRunner().invoke(cli, ["check", "--run", "2", "--max-excess", f"{100 * high / 2:.4f}pp",
                                         "--db", db])
        assert tight.exit_code == 1 and "excess over the noise floor upper bound" in tight.output
    alone = CliRunner().invoke(cli, ["check", "--run", "2", "--max-excess", "1pp", "--rule", "point", "--db", db])
    assert ("rule (--max-excess)" in alone.output) and alone.exit_code in (0, 1)


def test_a_statistic_added_once_reads_the_same_in_every_view(replayed):
    """The floor's interval width (issue 43's worked example of adding a statistic: `Rate.width`, one field in
    the floor's figures, one line per renderer): the same value in `summary --json`, the report's JSON, and the
    terminal, Markdown and HTML views."""
    db, tmp = replayed
    summary = _json("summary", "--run", "2", "--json", "--db", db)
    floor = summary["noise_floor"]["floor"]
    assert floor["ci_width"] == pytest.approx(floor["ci_high"] - floor["ci_low"]) and floor["ci_width"] > 0
    width = f"{100 * floor['ci_width']:.2f}"
    screen = CliRunner().invoke(cli, ["summary", "--run", "2", "--db", db])
    assert f"{width}pp wide" in screen.output, screen.output
    name = summary["customers"][0]["customer"]
    out = tmp / "width"
    report = _json("report", "--run", "2", "--customer", name, "--write", "json,md,html", "-o", str(out), "--json",
                   "--db", db)
    texts = {Path(f).suffix: Path(f).read_text() for f in report["files"]}
    nf = json.loads(texts[".json"])["noise_floor"]
    assert nf["ci_width"] == pytest.approx(nf["ci_high"] - nf["ci_low"])
    customer_width = f"{100 * nf['ci_width']:.2f}"
    assert f"{customer_width} points wide" in texts[".md"] and f"{customer_width} pts wide" in texts[".html"]


def test_the_excess_is_one_figure_in_every_view(replayed):
    """The floor figures' excess, defined and serialised once (`analysis/floor.py`): the same estimate and interval
    in the summary, the frontier's remedy row, the history row and a customer's summary row and report."""
    db, tmp = replayed
    summary = _json("summary", "--run", "2", "--json", "--db", db)
    e = summary["noise_floor"]["excess"]
    (remedy,) = _json("frontier", "--run", "2", "--json", "--db", db)["overall"]["remedies"]
    (row,) = [r for s in _json("history", "--json", "--db", db)["series"] for r in s["rows"] if r["run_id"] == 2]
    flat = {"excess": e["estimate"], "excess_ci_low": e["low"], "excess_ci_high": e["high"]}
    for view in (remedy, row):
        assert same({k: view[k] for k in flat}, flat)
    c = summary["customers"][0]
    report = _json("report", "--run", "2", "--customer", c["customer"], "--write", "json", "-o", str(tmp / "ex"),
                   "--json", "--db", db)
    nf = json.loads(Path(report["files"][0]).read_text())["noise_floor"]
    assert same({k: nf[k] for k in flat}, {k: c[k] for k in flat})


def test_the_excess_is_named_in_few_modules():
    """Issue 43's bar: one definition and serialization (analysis/floor.py), one budget (analysis/budgets.py), one
    rendering (report/floor.py), so a statistic changes in a few files; at most 4 modules name it."""
    from conftest import REPO

    naming = sorted(str(p.relative_to(REPO)) for p in (REPO / "toolaudit").rglob("*.py")
                    if "excess" in p.read_text().lower())
    assert len(naming) <= 4, naming
