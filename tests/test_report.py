"""Per-customer reports: figures, isolation between customers, escaping, and the HTML rendered in Chromium."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import line, tool_call, write_jsonl

from toolaudit.cli import cli
from toolaudit.compare import CompareOptions, compare_logs
from toolaudit.report import customer_report, is_noise_floor, parse_formats, slugs
from toolaudit.store import Store

CHROMIUM = Path("/usr/bin/chromium")
HOSTILE = '<script>alert("zephyr")</script>|pipe'

# Each customer's ids and values are distinctive: the customer's first word appears in all of them, and
# nowhere else, so "zephyr" in another customer's report is a leak.
CUSTOMERS = {
    "Zephyr Logistics": {"word": "zephyr", "query": "zephyr-cargo-manifest", "ticket": 7700100},
    "Quokka Mutual": {"word": "quokka", "query": "quokka-claim-dossier", "ticket": 4400100},
    "Walrus Freight": {"word": "walrus", "query": "walrus-ledger-entry", "ticket": 9000100},
}


def _calls(c: dict, s: int) -> list[tuple[str, dict]]:
    return [("search_tickets", {"query": f"{c['query']}-{s}", "limit": 5}),
            ("close_ticket", {"ticket_id": c["ticket"] + s}),
            ("search_tickets", {"query": f"{c['query']}-followup-{s}", "limit": 10,
                                "filters": {"status": ["open"]}})]


# (customer, session, call) -> candidate's (tool, arguments)
DRIFTS = {
    ("Zephyr Logistics", 0, 0): ("search_tickets", {"query": "zephyr-cargo-manifest-0", "limit": 50}),
    ("Zephyr Logistics", 1, 2): ("search_tickets", {"query": HOSTILE, "limit": 10,
                                                    "filters": {"status": ["open"]}}),
    ("Zephyr Logistics", 2, 1): ("close_ticket", {"ticket_id": "7700102"}),
    ("Zephyr Logistics", 3, 0): ("close_ticket", {"ticket_id": 7700103}),
    ("Quokka Mutual", 0, 0): ("search_tickets", {"query": "quokka-claim-dossier-0", "limit": 6}),
    ("Quokka Mutual", 4, 2): ("search_tickets", {"query": "quokka-claim-dossier-followup-4", "limit": 10,
                                                 "filters": {"status": ["closed"]}}),
    ("Walrus Freight", 5, 1): ("close_ticket", {"ticket_id": 9000106}),
}
# Baseline margins at the first divergent token (run 1); Walrus has no token evidence at all.
MARGINS = {("Zephyr Logistics", 0, 0): 3.5, ("Zephyr Logistics", 1, 2): 0.4, ("Zephyr Logistics", 2, 1): 0.0,
           ("Quokka Mutual", 0, 0): 0.2, ("Quokka Mutual", 4, 2): 0.05}


def session_id(customer: str, s: int) -> str:
    return f"{CUSTOMERS[customer]['word']}-sess-{s:03d}"


def _logs(tmp_path: Path, drifts: dict, name: str) -> Path:
    records = []
    for customer, c in CUSTOMERS.items():
        for s in range(6):
            for i, (tool, args) in enumerate(_calls(c, s)):
                tool, args = drifts.get((customer, s, i), (tool, args))
                records.append(line(session=session_id(customer, s), customer=customer,
                                    calls=[tool_call(tool, args)]))
    return write_jsonl(tmp_path / f"{name}.jsonl", records)


def build_db(tmp_path: Path, db_path: Path) -> None:
    """Run 1: candidate vs baseline with token evidence; run 2: noise floor (the baseline against itself)."""
    base = _logs(tmp_path, {}, "baseline")
    cand = _logs(tmp_path, DRIFTS, "candidate")
    noise_drift = ("search_tickets", {"query": "zephyr-cargo-manifest-5", "limit": 7})
    noise = _logs(tmp_path, {("Zephyr Logistics", 5, 0): noise_drift}, "noise")
    with Store(db_path) as store:
        compare_logs(store, base, cand, CompareOptions(schema_dir=None, run_name="nightly",
                                                       baseline_name="target", candidate_name="target+ngram"))
        compare_logs(store, base, noise, CompareOptions(schema_dir=None, run_name="noise",
                                                        baseline_name="target", candidate_name="target"))
        for (customer, s, i), margin in MARGINS.items():
            store.con.execute("""UPDATE calls SET first_divergence = 3, baseline_token = ' 5',
                candidate_token = ' 50', baseline_margin = ?, candidate_margin = 0.1
                WHERE run_id = 1 AND session_id = ? AND call_index = ?""",
                              [margin, session_id(customer, s), i])
        store.con.execute("""UPDATE calls SET baseline_margin = 0.125 WHERE run_id = 2 AND drifted""")
        # Decode evidence for the replayed customers only: Walrus stays a recorded log (no speed, no drafts).
        store.con.execute("""UPDATE outputs SET completion_tokens = 20,
                latency_s = CASE side WHEN 'baseline' THEN 0.5 ELSE 0.25 END,
                drafted_tokens = CASE side WHEN 'candidate' THEN 10 END,
                accepted_tokens = CASE side WHEN 'candidate' THEN 6 END
            WHERE run_id = 1 AND session_id NOT LIKE 'walrus%'""")
        # One Quokka call the candidate engine failed: an error row, never drift.
        store.con.execute("""INSERT INTO calls (run_id, session_id, call_index, customer, match_status,
            detail) VALUES (1, 'quokka-sess-000', 9, 'Quokka Mutual', 'error', 'candidate: out of memory')""")
        store.con.execute("""INSERT INTO outputs (run_id, session_id, call_index, side, path_name, error)
            VALUES (1, 'quokka-sess-000', 9, 'baseline', 'target', NULL),
                   (1, 'quokka-sess-000', 9, 'candidate', 'target+ngram', 'out of memory')""")
        store.con.execute("""UPDATE runs SET baseline_fingerprint = 'fp-target-0001',
            candidate_fingerprint = 'fp-spec-0002' WHERE run_id = 1""")


@pytest.fixture
def report_db(tmp_path, db_path) -> Path:
    build_db(tmp_path, db_path)
    return db_path


def _report(db_path: Path, customer: str, **kwargs) -> dict:
    from toolaudit.report import ReportOptions

    with Store(db_path, read_only=True) as store:
        return customer_report(store, 1, customer, ReportOptions(**kwargs))


def test_figures_per_customer(report_db):
    r = _report(report_db, "Zephyr Logistics")
    h = r["headline"]
    assert (h["calls"], h["drifted_calls"], h["sessions"], h["sessions_with_drift"]) == (18, 4, 6, 4)
    assert h["drift_kinds"] == {"identical": 14, "arguments_changed": 2, "schema_broken": 1,
                                "tool_name_changed": 1}
    base, cand = r["paths"]
    assert base["tokens_per_s"] == pytest.approx(40.0) and cand["tokens_per_s"] == pytest.approx(80.0)
    assert base["acceptance_rate"] is None and cand["acceptance_rate"] == pytest.approx(0.6)
    assert cand["tool_call_mismatch_rate"] == pytest.approx(4 / 18)
    assert (base["fingerprint"], cand["fingerprint"]) == ("fp-target-0001", "fp-spec-0002")
    m = r["margins"]
    assert (m["drifted_calls"], m["with_evidence"], m["near_tie"], m["large_margin"]) == (4, 3, 2, 1)
    assert sum(b["count"] for b in m["histogram"]) == 3
    first = r["examples"][0]
    assert first["attribution"] == "possible decode-path bug" and first["baseline_margin"] == 3.5
    assert first["arg_diffs"][0]["arg_path"] == "limit" and first["arg_diffs"][0]["candidate"] == "50"
    assert r["examples"][1]["drift_kind"] == "schema_broken"  # then schema breaks
    assert r["noise_floor"]["run_id"] == 2 and r["noise_floor"]["drifted_calls"] == 1
    assert r["noise_floor"]["max_drift_margin"] == 0.125
    args = {(a["tool_name"], a["arg_path"]): a for a in r["arguments"]}
    assert set(args) == {("search_tickets", "limit"), ("search_tickets", "query"),
                         ("close_ticket", "ticket_id")}
    assert args[("close_ticket", "ticket_id")]["rate"] == pytest.approx(1 / 6)
    assert args[("search_tickets", "limit")]["example_candidate"] == "50"
    assert len(r["session_length"]) == 10 and r["session_length"][0]["p"] == pytest.approx(4 / 18)


def test_recorded_logs_have_no_speed_and_no_token_evidence(report_db):
    r = _report(report_db, "Walrus Freight")
    assert all(p["tokens_per_s"] is None and p["acceptance_rate"] is None for p in r["paths"])
    assert r["margins"]["with_evidence"] == 0 and r["margins"]["without_evidence"] == 1
    assert r["examples"][0]["attribution"] == "no token evidence"


def test_noise_floor_and_compounding_use_only_the_customers_calls(report_db):
    quokka = _report(report_db, "Quokka Mutual")
    # The noise-floor run drifted on a Zephyr call only: Quokka's noise floor is zero, and Zephyr's margin
    # does not leak into it.
    assert quokka["noise_floor"]["drifted_calls"] == 0 and quokka["noise_floor"]["max_drift_margin"] is None
    # Compounded from Quokka's own per-tool rates: search_tickets 2/12, close_ticket 0/6; every session has
    # two search calls.
    expected = 1 - (1 - 2 / 12) ** 2
    assert quokka["headline"]["compounded_session_drift"] == pytest.approx(expected)
    assert quokka["headline"]["error_calls"] == 1 and quokka["headline"]["calls"] == 18
    assert [p["errors"] for p in quokka["paths"]] == [0, 1]


def test_every_format_is_isolated_per_customer(report_db, tmp_path):
    out = tmp_path / "reports"
    result = CliRunner().invoke(cli, ["report", "--db", str(report_db), "--run", "1", "--all-customers",
                                      "-o", str(out), "--max-call-drift", "2%", "--max-session-drift", "0.1"])
    assert result.exit_code == 0, result.output
    files = sorted(p.name for p in (out / "run-1").iterdir())
    assert files == sorted(f"{slug}.{ext}" for slug in ("zephyr-logistics", "quokka-mutual", "walrus-freight")
                           for ext in ("html", "md", "json"))
    slugs_in_order = ("quokka-mutual", "walrus-freight", "zephyr-logistics")  # customers sorted by name
    assert result.output.splitlines() == [str(out / "run-1" / f"{slug}.{ext}") for slug in slugs_in_order
                                          for ext in ("html", "md", "json")]
    for customer, c in CUSTOMERS.items():
        slug = customer.lower().replace(" ", "-")
        for ext in ("html", "md", "json"):
            text = (out / "run-1" / f"{slug}.{ext}").read_text()
            assert c["word"] in text.lower(), (customer, ext)  # its own data is there
            for other, o in CUSTOMERS.items():
                if other == customer:
                    continue
                lowered = text.lower()
                assert o["word"] not in lowered, (customer, ext, other)
                assert str(o["ticket"])[:5] not in text, (customer, ext, other)
    walrus = (out / "run-1" / "walrus-freight.html").read_text()
    assert '<div class="empty">no token evidence</div>' in walrus and walrus.count("<svg") == 2


def test_html_escapes_and_markdown_keeps_tables_intact(report_db, tmp_path):
    out = tmp_path / "r"
    CliRunner().invoke(cli, ["report", "--db", str(report_db), "--run", "1", "--customer", "Zephyr Logistics",
                             "-o", str(out)])
    html = (out / "run-1" / "zephyr-logistics.html").read_text()
    assert "<script" not in html and "&lt;script&gt;alert(" in html
    for external in ("src=", "href=", "url(", "@import", "https://"):
        assert external not in html
    assert html.count("<svg") == 3  # drift by tool, session length, margins
    md = (out / "run-1" / "zephyr-logistics.md").read_text()
    outside_code = re.sub(r"(`+) ?.+? ?\1", "", md)
    assert "<script" in md and "<script" not in outside_code  # only inside code spans, never as HTML
    assert "possible decode-path bug" in md and "fp-spec-0002" in md
    for block in re.split(r"\n\n", md):
        rows = [r for r in block.splitlines() if r.startswith("| ")]
        assert len({gfm_cells(r) for r in rows}) <= 1, block  # escaped pipes never add a column


def gfm_cells(row: str) -> int:
    """Cell separators as GitHub's table parser finds them: a backslash escapes the next character."""
    count, i = 0, 0
    while i < len(row):
        if row[i] == "\\":
            i += 2
            continue
        count += row[i] == "|"
        i += 1
    return count


def test_markdown_cells_never_split():
    from toolaudit.report import _md

    for value in ["a|b", "a\\|b", "a\\\\|b", "a\\\\\\|b", "`|`", "x\\"]:
        for code in (False, True):
            assert gfm_cells(f"| {_md(value, code)} |") == 2, (value, code)


def test_routing_advice(report_db):
    r = _report(report_db, "Zephyr Logistics", max_call_drift=0.5, max_session_drift=0.99, session_calls=3)
    rows = {a["scope"]: a for a in r["routing"]["rows"]}
    assert r["routing"]["session_calls"] == 3
    overall = rows["all tools"]
    assert overall["calls"] == 18 and overall["verdict"] == "candidate ok"
    assert overall["session_upper"] == pytest.approx(1 - (1 - overall["ci_high"]) ** 3)
    tight = _report(report_db, "Zephyr Logistics", max_call_drift=0.01)
    verdicts = {a["scope"]: (a["verdict"], a["reason"]) for a in tight["routing"]["rows"]}
    assert verdicts["all tools"] == ("target-only", "drift over budget")
    assert _report(report_db, "Walrus Freight")["routing"] is None


def test_html_renders_in_headless_chromium(report_db, tmp_path):
    if not CHROMIUM.exists():
        pytest.skip("/usr/bin/chromium not installed (apt-get install -y chromium)")
    out = tmp_path / "r"
    CliRunner().invoke(cli, ["report", "--db", str(report_db), "--run", "1", "--customer", "Zephyr Logistics",
                             "--format", "html", "-o", str(out), "--max-call-drift", "1.5%"])
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


def test_report_usage_errors(report_db, tmp_path):
    runner = CliRunner()
    db = ["--db", str(report_db)]
    result = runner.invoke(cli, ["report", *db])
    assert result.exit_code == 2 and "pass --customer C (repeatable) or --all-customers" in result.output
    result = runner.invoke(cli, ["report", *db, "--all-customers", "--customer", "x"])
    assert result.exit_code == 2
    result = runner.invoke(cli, ["report", *db, "--all-customers", "--format", "pdf", "-o", str(tmp_path)])
    assert result.exit_code == 1 and "unknown format 'pdf'; use html, md or json" in result.output
    result = runner.invoke(cli, ["report", *db, "--run", "1", "--customer", "Nobody", "-o", str(tmp_path)])
    assert result.exit_code == 1 and "run 1 has no calls for customer 'Nobody'" in result.output
    result = runner.invoke(cli, ["report", *db, "--all-customers", "--max-call-drift", "lots"])
    assert result.exit_code == 2 and "'lots' is not a proportion; use 0.015 or 1.5%" in result.output


def test_formats_slugs_and_noise_floor_labels(report_db, tmp_path):
    assert parse_formats([]) == ["html", "md", "json"]
    assert parse_formats(["md,json", "html", "markdown"]) == ["md", "json", "html"]
    names = slugs(["Acme Corp", "acme-corp", "Globex", "../../etc", "!!!"])
    assert names["Globex"] == "globex" and names["../../etc"] == "etc"
    assert names["Acme Corp"] != names["acme-corp"] and names["Acme Corp"].startswith("acme-corp-")
    assert re.fullmatch(r"customer-[0-9a-f]{6}", names["!!!"])
    assert is_noise_floor({"baseline_name": "t", "candidate_name": "t", "options": None})
    assert is_noise_floor({"baseline_name": "a", "candidate_name": "b", "options": '{"noise_floor": true}'})
    assert not is_noise_floor({"baseline_name": "a", "candidate_name": "b", "options": "{}"})
    out = tmp_path / "r"
    result = CliRunner().invoke(cli, ["report", "--db", str(report_db), "--run", "2", "--customer",
                                      "Quokka Mutual", "--format", "json", "-o", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "run-2" / "quokka-mutual.json").read_text())
    assert data["run"]["noise_floor_run"] is True and data["noise_floor"] is None


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


def test_charts_escape_labels_and_pick_round_axes():
    from toolaudit.charts import histogram, interval_chart, nice_max, percent_label, session_drift_chart

    assert [nice_max(v) for v in (0.013, 0.2, 0.45, 0.7, 3)] == [0.02, 0.2, 0.5, 1.0, 5]
    assert [percent_label(v) for v in (0, 0.0125, 0.125, 1.0)] == ["0%", "1.25%", "12.5%", "100%"]
    svg = interval_chart([('<img src=x onerror="boom">', 0.1, 0.05, 0.2)], "t & <t>", budget=0.15)
    assert "<img" not in svg and "&lt;img src=x" in svg and "<title>t &amp; &lt;t&gt;</title>" in svg
    assert "<script" not in histogram([("<script>", 1, True)], "h", "x", "a", "b")
    line_svg = session_drift_chart([(n, 0.1 * n / 10, 0.0, 0.2) for n in range(1, 11)], (3.5, 0.05), "s")
    assert line_svg.count("<circle") == 10 and "observed" in line_svg
