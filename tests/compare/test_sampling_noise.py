"""At temperature > 0 with one answer per call, a call that differs measures sampling noise: `compare` of two
recorded logs says so (from the requests' temperature) and labels its figures; a greedy comparison says
nothing of the kind."""

from __future__ import annotations

import json

from click.testing import CliRunner
from conftest import line, tool_call, write_jsonl

from toolaudit.cli import cli


def _log(path, temperature, limits):
    records = []
    for i, limit in enumerate(limits):
        rec = line(session=f"s{i}", calls=[tool_call("search_tickets", {"query": "open", "limit": limit})])
        if temperature is not None:
            rec["request"]["temperature"] = temperature
        records.append(rec)
    return write_jsonl(path, records)


def _compare(tmp_path, temperature):
    base = _log(tmp_path / "a.jsonl", temperature, [50, 50, 50, 50])
    cand = _log(tmp_path / "b.jsonl", temperature, [50, 500, 50, 5])
    db = tmp_path / f"t{temperature}.duckdb"
    runner = CliRunner()
    done = runner.invoke(cli, ["compare", str(base), str(cand), "--db", str(db)])
    assert done.exit_code == 0, done.output
    summary = runner.invoke(cli, ["summary", "--db", str(db), "--as", "json"])
    return done, json.loads(summary.output)


def test_compare_at_temperature_says_its_differences_are_sampling_noise(tmp_path):
    done, summary = _compare(tmp_path, 0.7)
    assert "sampling noise" in done.stderr and "--samples" in done.stderr
    assert "differing (noise)" in done.stdout and "drifted calls" not in done.stdout
    assert summary["sampling"] == {"temperature": 0.7, "samples_per_call": 1, "sampling_noise": True}
    assert summary["drifted_calls"] == 2  # still counted, as noise


def test_greedy_compare_carries_no_sampling_note(tmp_path):
    for temperature in (None, 0):
        done, summary = _compare(tmp_path, temperature)
        assert "sampling noise" not in done.stderr and "drifted calls" in done.stdout
        assert summary["sampling"] is None
