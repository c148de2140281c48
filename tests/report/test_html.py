"""The HTML rendering: escaping, no external assets, the charts, and the page rendered in Chromium."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import line, tool_call, write_jsonl

from toolaudit.cli import cli
from toolaudit.compare.logs import CompareOptions, compare_logs
from toolaudit.store import Store

CHROMIUM = Path("/usr/bin/chromium")


def test_html_escapes_and_loads_nothing_external(report_db, tmp_path):
    out = tmp_path / "r"
    CliRunner().invoke(cli, ["report", "--db", str(report_db), "--run", "1", "--customer", "Zephyr Logistics",
                             "-o", str(out)])
    html = (out / "run-1" / "zephyr-logistics.html").read_text()
    assert "<script" not in html and "&lt;script&gt;alert(" in html
    for external in ("src=", "href=", "url(", "@import", "https://"):
        assert external not in html
    assert html.count("<svg") == 3  # drift by tool, session length, margins


def test_html_renders_in_headless_chromium(report_db, tmp_path):
    if not CHROMIUM.exists():
        pytest.skip("/usr/bin/chromium not installed (apt-get install -y chromium)")
    out = tmp_path / "r"
    CliRunner().invoke(cli, ["report", "--db", str(report_db), "--run", "1", "--customer", "Zephyr Logistics",
                             "--as", "html", "-o", str(out), "--max-call-drift", "1.5%"])
    page = out / "run-1" / "zephyr-logistics.html"
    shot = tmp_path / "shot.png"
    flags = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--enable-logging=stderr",
             "--v=0"]
    dom = subprocess.run(flags + [f"--user-data-dir={tmp_path / 'p1'}", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120, check=False)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count("<svg") == 3 and "Zephyr Logistics" in dom.stdout
    shoot = subprocess.run(flags + [f"--user-data-dir={tmp_path / 'p2'}", f"--screenshot={shot}",
                                    "--window-size=1200,2000", page.as_uri()],
                           capture_output=True, text=True, timeout=120, check=False)
    assert shoot.returncode == 0, shoot.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    for log in (dom.stderr, shoot.stderr):
        assert ":CONSOLE" not in log and "Uncaught" not in log and "net::ERR" not in log


def test_report_without_drift_or_sessions_renders(tmp_path, db_path):
    b = write_jsonl(tmp_path / "b.jsonl", [line(session="s1", customer="solo",
                                                calls=[tool_call("close_ticket", {"ticket_id": 1})])])
    with Store(db_path) as store:
        compare_logs(store, b, b, CompareOptions(schema_dir=None))
    result = CliRunner().invoke(cli, ["report", "--db", str(db_path), "--all-customers",
                                      "-o", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    html = (tmp_path / "o" / "run-1" / "solo.html").read_text()
    assert "No drifted calls." in html and "0.00%" in html

