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
    # each block after the first reads what the first wrote: run them in order, into this test's folder
    for code in blocks[: index + 1] if index in (1, 3) else [blocks[index]]:
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
    assert s.speed.speedup is None and s.excess is None  # recorded logs: no timings, no floor
    with toolaudit.open(db) as opened:
        assert [r.run_id for r in opened.runs()] == [run.run_id]
        assert len(opened.run().calls().fetchall()) == printed["calls"] + sum(
            printed["unmatched_calls"].values()) + sum(printed["not_compared"].values()) + printed["error_rows"]
