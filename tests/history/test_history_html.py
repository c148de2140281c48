"""`report --history`: the page (inline SVG, no script, nothing external), its markers on the right runs as a real
browser lays them out (headless Chromium), one page per customer with that customer's data only, usage errors."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from toolaudit.cli import cli

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--enable-logging=stderr", "--v=0"]

# Appended to a copy of the page: reads where Chromium drew each marker, point and budget line.
MEASURE = """<script>
const out = [];
for (const svg of document.querySelectorAll('section.series svg')) {
  const pair = svg.closest('section').dataset.candidate;
  const centre = el => { const b = el.getBoundingClientRect(); return [b.x + b.width / 2, b.y + b.height / 2]; };
  const points = [...svg.querySelectorAll('circle.point')].map(c => [c.dataset.runId, ...centre(c)]);
  const budget = svg.querySelector('line.budget');
  const box = svg.getBoundingClientRect();
  for (const m of svg.querySelectorAll('g.marker')) {
    const [mx] = centre(m);
    const near = points.reduce((a, p) => Math.abs(p[1] - mx) < Math.abs(a[1] - mx) ? p : a);
    out.push({pair, kind: 'marker', run: m.dataset.runId, change: m.dataset.change, nearest: near[0],
              dx: Math.abs(near[1] - mx)});
  }
  for (const p of points) out.push({pair, kind: 'point', run: p[0], x: p[1], y: p[2]});
  out.push({pair, kind: 'svg', width: box.width, height: box.height,
            budget_y: budget ? centre(budget)[1] : null});
}
const pre = document.createElement('pre'); pre.id = 'measured'; pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script>"""


def _report(db, out, *args):
    """`history --html`: the pages (the deprecated `report --history` writes the same, with a warning)."""
    result = CliRunner().invoke(cli, ["history", "--html", "--db", str(db), "-o", str(out), *args])
    assert result.exit_code == 0, result.output
    return result.output.split()


def _report_history(db, out, *args):
    result = CliRunner().invoke(cli, ["report", "--history", "--db", str(db), "-o", str(out), *args])
    assert result.exit_code == 0, result.output
    assert "deprecated: use `toolaudit history --html`" in result.stderr
    return result.stdout.split()


def _markers(html: str) -> set[tuple[int, str]]:
    return {(int(r), c) for r, c in re.findall(r'<g class="marker" data-run-id="(\d+)" data-change="(\w+)">', html)}


EXPECTED = {  # (night index or name, change) as test_history.py explains each
    (1, "config"), (3, "numerics"), (4, "config"), (4, "decisions"), ("matrix_candidate", "numerics")}


def _expected(ids) -> set[tuple[int, str]]:
    return {(ids.nights[k] if isinstance(k, int) else getattr(ids, k), change) for k, change in EXPECTED}


def test_page_is_self_contained_with_a_chart_per_pair_and_markers_on_changed_runs(history_db, tmp_path):
    db, ids = history_db
    (page,) = _report(db, tmp_path, "--budget", "2%")
    assert page == str(tmp_path / "history.html")
    html = Path(page).read_text()
    assert "<script" not in html
    for external in ("src=", "href=", "url(", "@import", "https://"):
        assert external not in html
    assert html.count("<svg") == 3  # target vs spec-ngram, prod vs canary, target vs spec-draft
    assert _markers(html) == _expected(ids)
    assert html.count('class="budget"') == 3 and 'data-budget="0.02"' in html
    five = re.search(rf'<tr class="changed" data-run-id="{ids.nights[4]}">(.*?)</tr>', html).group(1)
    assert "speculative.num_speculative_tokens 4 -&gt; 8" in five and "+2.25pp*" in five


def test_markers_sit_on_their_runs_in_chromium(history_db, tmp_path):
    if not CHROMIUM.exists():
        pytest.skip("/usr/bin/chromium not installed (apt-get install -y chromium)")
    db, ids = history_db
    (page,) = _report(db, tmp_path / "r", "--budget", "2%")
    dom = subprocess.run([str(CHROMIUM), *FLAGS, f"--user-data-dir={tmp_path / 'p1'}", "--dump-dom",
                          Path(page).as_uri()], capture_output=True, text=True, timeout=120, check=False)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count("<svg") == 3 and _markers(dom.stdout) == _expected(ids)
    assert ":CONSOLE" not in dom.stderr and "net::ERR" not in dom.stderr
    measured = tmp_path / "measured.html"
    measured.write_text(Path(page).read_text().replace("</body>", MEASURE + "</body>"))
    dom = subprocess.run([str(CHROMIUM), *FLAGS, f"--user-data-dir={tmp_path / 'p2'}", "--window-size=1280,2000",
                          "--dump-dom", measured.as_uri()], capture_output=True, text=True, timeout=120, check=False)
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = json.loads(re.search(r'<pre id="measured">(.*?)</pre>', dom.stdout, re.S).group(1))
    markers = [m for m in found if m["kind"] == "marker"]
    # each marker is drawn straight above the point of the run it names, and that is the run that changed
    assert {(int(m["run"]), m["change"]) for m in markers} == _expected(ids)
    assert all(m["nearest"] == m["run"] and m["dx"] < 1.0 for m in markers), markers
    svgs = [s for s in found if s["kind"] == "svg"]
    assert len(svgs) == 3 and all(s["width"] > 500 and s["height"] > 200 for s in svgs)
    # the points run left to right in run order, and the budget line (2%) lies between night 1 (0.25%) and night
    # 5 (3.00%): screen y grows downwards
    ngram = {int(p["run"]): p for p in found if p["kind"] == "point" and p["pair"] == "spec-ngram"}
    assert sorted(ngram, key=lambda r: ngram[r]["x"]) == sorted(ngram)
    budget_y = next(s["budget_y"] for s in svgs if s["pair"] == "spec-ngram")
    assert ngram[ids.nights[4]]["y"] < budget_y < ngram[ids.nights[0]]["y"]


def test_a_page_per_customer_holds_only_its_data(history_db, tmp_path):
    db, ids = history_db
    pages = _report_history(db, tmp_path, "--all-customers", "--write", "html,json")
    assert sorted(Path(p).relative_to(tmp_path).as_posix() for p in pages) == [
        "history/acme.html", "history/acme.json", "history/globex.html", "history/globex.json"]
    acme = (tmp_path / "history" / "acme.html").read_text()
    assert "globex" not in acme and "globex" not in (tmp_path / "history" / "acme.json").read_text()
    assert f'data-run-id="{ids.globex_only}"' not in acme  # a night with no acme calls
    assert "Drift over time: acme" in acme and _markers(acme) == _expected(ids)
    data = json.loads((tmp_path / "history" / "acme.json").read_text())
    assert data["customer"] == "acme" and {r["calls"] for s in data["series"] for r in s["rows"]} == {200}
    globex = (tmp_path / "history" / "globex.html").read_text()
    assert "acme" not in globex and f'data-run-id="{ids.globex_only}"' in globex
    (one,) = _report(db, tmp_path / "one", "--customer", "acme", "--path-pair", "target", "spec-ngram")
    assert Path(one).read_text().count("<svg") == 1


def test_history_usage_errors(history_db, tmp_path):
    db, _ = history_db
    run = CliRunner().invoke
    base = ["report", "--db", str(db), "-o", str(tmp_path)]
    with_run = run(cli, [*base, "--history", "--run", "1"])
    assert with_run.exit_code == 2 and "--run does not go with it" in with_run.output
    markdown = run(cli, [*base, "--history", "--as", "md"])
    assert markdown.exit_code == 2 and "html or json" in markdown.output
    pair_alone = run(cli, [*base, "--all-customers", "--path-pair", "target", "spec-ngram"])
    assert pair_alone.exit_code == 2 and "--path-pair goes with `toolaudit history --html`" in pair_alone.output
    session = run(cli, [*base, "--history", "--max-session-drift", "5%"])
    assert session.exit_code == 2 and "--max-call-drift" in session.output
    unknown = run(cli, [*base, "--history", "--customer", "initech"])
    assert unknown.exit_code == 2 and "initech" in unknown.output
    assert not list(tmp_path.iterdir())
