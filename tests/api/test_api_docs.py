"""docs/api.md's examples run as written, and the Python API gives the figures the CLI prints."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from conftest import REPO


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (REPO / "docs" / "api.md").read_text(), re.S)


@pytest.mark.parametrize("index", range(len(_blocks())))
def test_the_api_page_runs(index, monkeypatch, tmp_path):
    monkeypatch.chdir(REPO)
    blocks = _blocks()
    # blocks 1 and 3 read what block 0 wrote: it runs first, into this test's folder (not block 2: a real replay)
    for code in [blocks[0], blocks[index]] if index in (1, 3) else [blocks[index]]:
        exec(compile(code.replace("/tmp/", f"{tmp_path}/"), "docs/api.md", "exec"), {})  # noqa: S102


def test_the_api_gives_the_figures_the_cli_prints(tmp_path):
    import toolaudit
    from toolaudit.cli import cli

    db = tmp_path / "a.duckdb"
    run = toolaudit.compare(REPO / "traces" / "example_baseline.jsonl", REPO / "traces" / "example_candidate.jsonl",
                            db=db)
    printed = json.loads(CliRunner().invoke(cli, ["summary", "--json", "--db", str(db)]).output)
    s = run.summary()
    assert (s.drift.k, s.drift.n) == (printed["drifted_calls"], printed["calls"]) and s.as_dict() == printed
    assert s.speed.speedup is None and s.noise_floor is None  # recorded logs: no timings, no floor
    with toolaudit.open(db) as opened:
        assert [r.run_id for r in opened.runs()] == [run.run_id]
        assert len(opened.run().calls().fetchall()) == printed["calls"] + sum(
            printed["unmatched_calls"].values()) + sum(printed["not_compared"].values()) + printed["error_rows"]


def test_the_api_gives_the_floor_figures_and_judges_a_budget_on_them(tmp_path):
    """A matrix whose last candidate is the baseline log again under the baseline's name (a noise floor): the
    summary's typed floor figures are those `summary --json` prints, and `Run.frontier` takes any budget."""
    import shutil

    import toolaudit
    from toolaudit.cli import cli

    base = REPO / "traces" / "example_baseline.jsonl"
    floor = tmp_path / "floor" / "baseline.jsonl"  # named as the baseline: the baseline against itself
    floor.parent.mkdir()
    shutil.copy(base, floor)
    db = tmp_path / "f.duckdb"
    matrix = toolaudit.compare(base, [REPO / "traces" / "example_candidate.jsonl", floor], db=db)
    with toolaudit.open(db) as opened:
        s = opened.run(matrix.run_id + 1).summary()
        f = s.noise_floor
        assert f is not None and f.calls and f.as_dict() == {k: v for k, v in s.as_dict()["noise_floor"].items()
                                                               if k not in ("tools", "tools_keyed")}
        printed = json.loads(CliRunner().invoke(cli, ["summary", "--json", "--db", str(db)]).output)
        assert printed["noise_floor"]["excess"]["estimate"] == f.excess.estimate > 0
        loose = opened.run(matrix.run_id).frontier(max_excess=1.0)
        tight = opened.run(matrix.run_id).frontier(max_excess=0.0, max_call_drift=1.0)
    assert [r.within_budget for r in loose.remedies] == [True]
    assert [r.within_budget for r in tight.remedies] == [False]
    assert tight.remedies[0].floor_figures.excess == f.excess
