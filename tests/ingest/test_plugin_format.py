"""A trace format from a third-party distribution: tests/plugins/toolaudit-csv-format is installed with real pip into
a temporary folder, and a real `toolaudit compare` reads two files in its format through the entry point group
`toolaudit.formats` (auto-detected and with --format), storing the same rows as for any built-in format. A plug-in
that clashes or does not load stops the command with an error naming its distribution and entry point."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner
from conftest import REPO

from toolaudit.cli import cli
from toolaudit.ingest import registry

PLUGIN = REPO / "tests" / "plugins" / "toolaudit-csv-format"
HEADER = "session,customer,prompt,tool,arguments\n"
BASELINE = HEADER + """s1,acme,close ticket 7,close_ticket,"{""ticket_id"": 7}"
s1,acme,search tickets about refunds,search_tickets,"{""query"": ""refund"", ""limit"": 5}"

s2,globex,close ticket 9,close_ticket,"{""ticket_id"": 9}"
"""
CANDIDATE = HEADER + """s1,acme,close ticket 7,close_ticket,"{""ticket_id"":7}"
s1,acme,search tickets about refunds,search_tickets,"{""query"": ""refund"", ""limit"": 3}"
s2,globex,close ticket 9,reopen_ticket,"{""ticket_id"": 9}"
s3,,a row without its tool,,{}
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The plug-in installed by pip into a folder of its own (built from a copy: pip builds in the source tree)."""
    root = tmp_path_factory.mktemp("plugin")
    source = shutil.copytree(PLUGIN, root / "src")
    target = root / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--disable-pip-version-check", "--target", str(target), str(source)],
                   check=True, capture_output=True)
    assert (target / "toolaudit_csv_format.py").exists()
    return target


def toolaudit(installed: Path, *args: str) -> subprocess.CompletedProcess:
    """A real `toolaudit` process (this checkout's code) that sees the plug-in."""
    env = {**os.environ, "PYTHONPATH": str(installed)}
    return subprocess.run([sys.executable, "-m", "toolaudit", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)


def test_builtin_formats_are_entry_points_like_any_plugin():
    names = {ep.name: ep.value for ep in entry_points(group=registry.GROUP)}
    assert {n: names.get(n) for n in registry.BUILTIN} == {
        n: f"{module}:FORMAT" for n, module in registry.BUILTIN.items()}
    assert list(registry.registered())[:len(registry.BUILTIN)] == list(registry.BUILTIN)


@pytest.mark.parametrize("forced", [False, True], ids=["detected", "forced"])
def test_compare_reads_a_plugin_format(installed, tmp_path, forced):
    b, c = tmp_path / "baseline.csv", tmp_path / "candidate.csv"
    b.write_text(BASELINE)
    c.write_text(CANDIDATE)
    db = tmp_path / "audit.duckdb"
    result = toolaudit(installed, "compare", str(b), str(c), "--db", str(db), "--schemas", str(tmp_path / "none"),
                       *(["--format", "csv"] if forced else []))
    assert result.returncode == 0, result.stderr
    with duckdb.connect(str(db), read_only=True) as con:
        calls = con.execute("SELECT session_id, call_index, customer, match_status, drift_kind FROM calls "
                            "ORDER BY ALL").fetchall()
        outputs = con.execute("SELECT side, source, line FROM outputs WHERE session_id = 's2' ORDER BY side"
                              ).fetchall()
        errors = con.execute("SELECT side, source, line, field, message FROM trace_errors").fetchall()
        counts = json.loads(con.execute("SELECT counts FROM runs").fetchone()[0])
    assert calls == [("s1", 0, "acme", "matched", "identical"), ("s1", 1, "acme", "matched", "arguments_changed"),
                     ("s2", 0, "globex", "matched", "tool_name_changed")]
    assert outputs == [("baseline", str(b), 5), ("candidate", str(c), 4)]  # the user's lines (a blank one counted)
    assert errors == [("candidate", str(c), 5, "tool", "missing: the answer names the tool it calls")]
    assert counts["formats"] == {"baseline": "csv", "candidate": "csv"}
    assert counts["skipped_reasons"] == {"baseline": {"header row": 1}, "candidate": {"header row": 1}}
    assert counts["candidate"] == {"lines": 5, "blank": 0, "calls": 3, "errors": 1, "skipped": 1, "records": 5}


def test_help_lists_the_plugin_format(installed):
    result = toolaudit(installed, "compare", "--help")
    assert result.returncode == 0, result.stderr
    assert "[auto|openai|otel|openinference|langfuse|responses|phoenix|csv]" in result.stdout
    assert "csv: model calls as CSV rows" in " ".join(result.stdout.split())


def _distribution(site: Path, name: str, entry: str) -> None:
    """An installed distribution as pip leaves it: a .dist-info folder with its metadata and entry points."""
    info = site / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[toolaudit.formats]\n{entry}\n")


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A folder on sys.path for distributions written by the test; the registry forgets them afterwards."""
    path = tmp_path / "site"
    path.mkdir()
    monkeypatch.syspath_prepend(str(path))
    registry.reset()
    yield path
    monkeypatch.undo()
    registry.reset()


def test_a_plugin_taking_a_builtin_name_is_an_error_naming_both(site, tmp_path):
    (site / "otel_again.py").write_text("from toolaudit.ingest.formats.otel import FORMAT\n")
    _distribution(site, "otel-again", "otel = otel_again:FORMAT")
    with pytest.raises(registry.FormatPluginError) as err:
        registry.registered()
    assert "trace format 'otel' is registered twice" in str(err.value)
    assert "distribution toolaudit 0.1.0 (entry point otel = toolaudit.ingest.formats.otel:FORMAT)" in str(err.value)
    assert "distribution otel-again 1.0 (entry point otel = otel_again:FORMAT)" in str(err.value)


def test_a_plugin_that_fails_to_load_stops_the_command_naming_it(site, tmp_path):
    (site / "broken_format.py").write_text("import a_module_that_is_not_there\n")
    _distribution(site, "broken-format", "broken = broken_format:FORMAT")
    log = tmp_path / "a.jsonl"
    log.write_text("{}\n")
    result = CliRunner().invoke(cli, ["compare", str(log), str(log), "--db", str(tmp_path / "a.duckdb")])
    assert result.exit_code == 1
    assert ("trace format plug-in 'broken' from distribution broken-format 1.0 (entry point broken = "
            "broken_format:FORMAT) failed to load: ModuleNotFoundError") in result.output
    shown = CliRunner().invoke(cli, ["compare", "--help"])  # help still shows, without the formats it cannot list
    assert shown.exit_code == 0 and "--format [auto]" in shown.output


def test_a_plugin_object_that_is_not_a_format_is_an_error(site):
    (site / "not_a_format.py").write_text("FORMAT = {'name': 'dict'}\n")
    _distribution(site, "not-a-format", "dict = not_a_format:FORMAT")
    with pytest.raises(registry.FormatPluginError, match="is a dict, not a toolaudit.ingest.formats.TraceFormat"):
        registry.registered()
