"""The CLI through click's runner, checked against the database it wrote."""

from __future__ import annotations

import json

from click.testing import CliRunner
from conftest import REPO, line, tool_call, write_jsonl

from toolaudit import __version__
from toolaudit.cli import cli


def _logs(tmp_path):
    b = [line(session=f"s{i}", customer=["acme", "globex"][i % 2],
              calls=[tool_call("search_tickets", {"query": "q", "limit": 5})]) for i in range(6)]
    c = [dict(r) for r in b]
    c[0] = line(session="s0", customer="acme", calls=[tool_call("search_tickets", {"query": "q", "limit": 50})])
    return write_jsonl(tmp_path / "b.jsonl", b), write_jsonl(tmp_path / "c.jsonl", c)


def test_every_command_has_a_one_line_docstring():
    for name, command in cli.commands.items():
        assert command.help and command.help.strip(), name
        assert command.help.strip().splitlines()[0].endswith("."), name


def test_version_and_short_help():
    runner = CliRunner()
    assert __version__ in runner.invoke(cli, ["--version"]).output
    assert "compare" in runner.invoke(cli, ["-h"]).output


def test_compare_summary_runs_sql(tmp_path, db_path):
    b, c = _logs(tmp_path)
    runner = CliRunner()
    result = runner.invoke(cli, ["compare", str(b), str(c), "--db", str(db_path), "--run-name", "nightly"])
    assert result.exit_code == 0, result.output
    assert "drifted calls         1 of 6 compared (16.67%" in result.output
    assert "acme" in result.output and "globex" in result.output
    s = json.loads(runner.invoke(cli, ["summary", "--db", str(db_path), "--json"]).output)
    assert s["calls"] == 6 and s["drifted_calls"] == 1 and s["run_name"] == "nightly"
    assert {c["customer"]: c["drifted_calls"] for c in s["customers"]} == {"acme": 1, "globex": 0}
    runs = json.loads(runner.invoke(cli, ["runs", "--db", str(db_path), "--json"]).output)
    assert [(r["run_id"], r["name"], r["calls"]) for r in runs] == [(1, "nightly", 6)]
    csv_out = runner.invoke(cli, ["sql", "SELECT arg_path, baseline_value, candidate_value FROM arg_diffs",
                                  "--db", str(db_path), "--csv"]).output
    assert csv_out.splitlines() == ["arg_path,baseline_value,candidate_value", "limit,5,50"]
    empty = runner.invoke(cli, ["sql", "SELECT * FROM calls WHERE false", "--db", str(db_path), "--json"])
    assert json.loads(empty.output) == []


def test_db_from_environment(tmp_path, db_path):
    b, c = _logs(tmp_path)
    runner = CliRunner(env={"TOOLAUDIT_DB": str(db_path)})
    assert runner.invoke(cli, ["compare", str(b), str(c)]).exit_code == 0
    assert db_path.exists()


def test_summary_errors(tmp_path, db_path):
    runner = CliRunner()
    result = runner.invoke(cli, ["summary", "--db", str(tmp_path / "none.duckdb")])
    assert result.exit_code == 2 and "no such database" in result.output  # nothing to read: as a missing run
    b, c = _logs(tmp_path)
    runner.invoke(cli, ["compare", str(b), str(c), "--db", str(db_path)])
    result = runner.invoke(cli, ["summary", "--db", str(db_path), "--run", "42"])
    assert result.exit_code == 2 and "no run with id 42" in result.output
    result = runner.invoke(cli, ["summary", "--db", str(db_path), "--json", "--csv"])
    assert result.exit_code == 2


def test_python_dash_m(tmp_path, db_path):
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "toolaudit", "--version"], capture_output=True, text=True,
                         cwd=REPO)
    assert out.returncode == 0 and __version__ in out.stdout
