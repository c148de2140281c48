"""The per-customer report of a sampled run: the customer's own distribution tests (shifted calls as the run-wide
BH verdicts on its calls, its own global test, paired rates) and its most-shifted calls with both outcome histograms,
in JSON, Markdown and HTML; nothing of another customer; the greedy figures labelled as sample 0's noise."""

from __future__ import annotations

import json
import re
import subprocess
from html import escape, unescape
from pathlib import Path

import pytest
from click.testing import CliRunner
from sampled_scenario import LONG, WORDS, N, outcome, write_sampled_run

from toolaudit.analysis.sampled import customer_sampled
from toolaudit.cli import cli
from toolaudit.compare import distributions as dist
from toolaudit.report import customer_report
from toolaudit.report.charts import OUTCOME_LABEL
from toolaudit.store import Store
from toolaudit.store import sampled_queries as sq

ZEPHYR, QUOKKA = "Zephyr Logistics", "Quokka Mutual"
CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def sampled_report(tmp_path_factory):
    """Run 1, sampled: the candidate's distribution moves on Zephyr's calls only; every format for both."""
    root = tmp_path_factory.mktemp("sampled-report")
    db = root / "s.duckdb"
    with Store(db) as store:
        run_id = write_sampled_run(store)
    out = root / "reports"
    result = CliRunner().invoke(cli, ["report", "--db", str(db), "--run", str(run_id), "--all-customers",
                                      "-o", str(out)])
    assert result.exit_code == 0, result.output
    return {"db": db, "run": run_id, "dir": out / f"run-{run_id}"}


def _files(sampled_report, slug: str) -> dict[str, str]:
    return {ext: (sampled_report["dir"] / f"{slug}.{ext}").read_text() for ext in ("html", "md", "json")}


def test_the_customers_figures_are_its_own_calls(sampled_report):
    with Store(sampled_report["db"], read_only=True) as store:
        rows = sq.sampled_call_rows(store, sampled_report["run"])
        view = {(r["session_id"], r["call_index"]): r["shifted"] for r in sq.view_shifts(store, sampled_report["run"])}
        samples: dict = {}
        for session, call, side, out, *_ in sq.sample_rows(store, sampled_report["run"]):
            samples.setdefault((session, call), {}).setdefault(side, []).append(out)
        figures = {c: customer_sampled(store, sampled_report["run"], c) for c in WORDS}
        assert customer_sampled(store, sampled_report["run"], "Nobody") is None
    for customer, s in figures.items():
        mine = [(r["session_id"], r["call_index"]) for r in rows if r["customer"] == customer]
        assert s["calls"] == s["calls_tested"] == len(mine) == 12
        assert s["shifted_calls"] == sum(view[k] for k in mine)  # the run-wide verdicts, restricted
        own = dist.global_test([(samples[k]["baseline"], samples[k]["candidate"]) for k in mine], 0)
        assert s["global_p"] == own.p_value and s["global_calls"] == 12
        shown = s["most_shifted"]
        assert len(shown) == 5 and [c["p_value"] for c in shown] == sorted(c["p_value"] for c in shown)
        assert all((c["session_id"], c["call_index"]) in mine and c["customer"] == customer for c in shown)
        for c in shown:
            assert sum(h["samples"] for h in c["baseline"]) == c["n_baseline"] == N
    zephyr, quokka = figures[ZEPHYR], figures[QUOKKA]
    assert zephyr["shifted_calls"] >= 10 and zephyr["global_p"] < 0.001
    assert quokka["shifted_calls"] == 0 and quokka["global_p"] > 0.05
    valid = zephyr["paired"]["schema_valid_rate"]
    assert valid["high"] < 0 and valid["calls"] == 12  # the shift trades tool calls for no tool call
    assert quokka["paired"]["schema_valid_rate"]["low"] < 0 < quokka["paired"]["schema_valid_rate"]["high"]


def test_no_format_carries_another_customers_data(sampled_report):
    for customer, word in WORDS.items():
        files = _files(sampled_report, customer.lower().replace(" ", "-"))
        for ext, text in files.items():
            assert f"{word}-cargo-manifest" in text, (customer, ext)  # its own outcomes are there
            for other in set(WORDS.values()) - {word}:
                assert other not in text.lower(), (customer, ext, other)
        data = json.loads(files["json"])
        assert data["sampled"]["customer"] == customer and data["sampled"]["calls"] == 12


def test_the_greedy_figures_are_labelled_sampling_noise(sampled_report):
    files = _files(sampled_report, "zephyr-logistics")
    data = json.loads(files["json"])
    assert data["sampling"] == {"temperature": 0.7, "samples_per_call": N, "sampling_noise": True,
                                "greedy_figures": "sample 0 of each side"}
    assert "Sample 0 differs (noise)" in files["html"] and "Drifted calls" not in files["html"]
    for text in (files["html"], files["md"]):
        assert "tool calls differ in sample 0 (sampling noise)" in text and "tool calls drifted" not in text
        assert "compare sample 0 of each side, which measures sampling noise, not drift" in text


def test_html_and_markdown_show_the_sampled_section(sampled_report):
    files = _files(sampled_report, "zephyr-logistics")
    shown = json.loads(files["json"])["sampled"]["most_shifted"]
    html, md = files["html"], files["md"]
    assert html.count('class="chart outcomes"') == len(shown) == 5
    assert html.count('<div class="example shifted-call"') == 5
    assert "<script" not in html and "https://" not in html
    # The long outcome: clipped under its bar, whole in the <title>s (bar and label).
    long_outcome = outcome(ZEPHYR, LONG)[0]
    assert len(long_outcome) > 100 and html.count(f"<title>{escape(long_outcome)}</title>") >= 1
    labels = [unescape(x) for x in re.findall(r'<g class="label"><title>[^<]*</title><text[^>]*>([^<]*)</text>', html)]
    assert len(labels) == 2 * sum(len({h["outcome"] for side in ("baseline", "candidate") for h in c[side]})
                                  for c in shown)  # one label per bar, both panels
    assert max(len(label) for label in labels) <= OUTCOME_LABEL and any(lb.endswith("…") for lb in labels)
    assert "## Sampled decoding" in md and "### Most-shifted calls" in md
    assert md.count("| outcome | baseline samples | candidate samples |") == 5
    first = shown[0]
    for h in first["baseline"]:  # the outcome table has each count
        assert re.search(rf"\| `{re.escape(h['outcome'])}` \| {h['samples']} \| \d+ \|", md), h


def test_a_customer_without_a_shift_reads_so(sampled_report):
    data = json.loads(_files(sampled_report, "quokka-mutual")["json"])
    with Store(sampled_report["db"], read_only=True) as store:
        again = customer_report(store, sampled_report["run"], QUOKKA)["sampled"]
    assert data["sampled"]["shifted_calls"] == again["shifted_calls"] == 0
    assert data["sampled"]["global_p"] == again["global_p"]  # deterministic for the same rows


MEASURE = """<script>
const out = [];
for (const svg of document.querySelectorAll("svg.outcomes")) {
  const panels = [];
  for (const g of svg.querySelectorAll("g.histogram")) {
    const grid = [...g.querySelectorAll("line")].map(l => l.getBoundingClientRect().top);
    const bars = [...g.querySelectorAll("rect.bar")].map(r => {
      const b = r.getBoundingClientRect();
      return {outcome: r.dataset.outcome, samples: +r.dataset.samples, height: b.height, bottom: b.bottom};
    });
    panels.push({side: g.dataset.side, zero: Math.max(...grid), topline: Math.min(...grid), bars});
  }
  out.push({top: +svg.dataset.top, width: svg.getBoundingClientRect().width, panels});
}
const pre = document.createElement("pre");
pre.id = "measured";
pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script>"""


def test_histograms_render_in_headless_chromium(sampled_report, tmp_path):
    """The page as Chromium lays it out (a copy with a measuring script; the report itself has none): one pair of
    histograms per most-shifted call, and every bar as tall as its samples on the chart's axis."""
    if not CHROMIUM.exists():
        pytest.skip("/usr/bin/chromium not installed (apt-get install -y chromium)")
    files = _files(sampled_report, "zephyr-logistics")
    shown = json.loads(files["json"])["sampled"]["most_shifted"]
    page = tmp_path / "measured.html"
    page.write_text(files["html"].replace("</body>", MEASURE + "</body>"))
    flags = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1200,2000"]
    dom = subprocess.run(flags + [f"--user-data-dir={tmp_path / 'p'}", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120, check=False)
    assert dom.returncode == 0, dom.stderr[-2000:]
    measured = json.loads(unescape(re.search(r'<pre id="measured">(.*?)</pre>', dom.stdout, re.S).group(1)))
    assert len(measured) == len(shown) == 5
    for chart, call in zip(measured, shown):
        assert chart["width"] > 500  # laid out at the page's width, not collapsed
        assert [p["side"] for p in chart["panels"]] == ["baseline", "candidate"]
        for panel in chart["panels"]:
            counts = {h["outcome"]: h["samples"] for h in call[panel["side"]]}
            drawn = {b["outcome"]: b["samples"] for b in panel["bars"]}
            assert {o: n for o, n in drawn.items() if n} == counts  # every outcome of the side, with its count
            assert sum(drawn.values()) == call[f"n_{panel['side']}"] == N
            per_sample = (panel["zero"] - panel["topline"]) / chart["top"]  # px per sample on the axis
            assert per_sample > 5
            for bar in panel["bars"]:
                assert bar["height"] == pytest.approx(bar["samples"] * per_sample, abs=1.0), bar
                if bar["samples"]:
                    assert bar["bottom"] == pytest.approx(panel["zero"], abs=1.0)  # standing on the axis
