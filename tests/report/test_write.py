"""Writing report files through the CLI: one file per customer and format, each isolated to its customer;
usage errors; format names."""

from __future__ import annotations

from click.testing import CliRunner

from toolaudit.cli import cli
from toolaudit.report import parse_formats

from .scenario import CUSTOMERS


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


def test_report_usage_errors(report_db, tmp_path):
    runner = CliRunner()
    db = ["--db", str(report_db)]
    result = runner.invoke(cli, ["report", *db])
    assert result.exit_code == 2 and "pass --customer C (repeatable) or --all-customers" in result.output
    result = runner.invoke(cli, ["report", *db, "--all-customers", "--customer", "x"])
    assert result.exit_code == 2
    result = runner.invoke(cli, ["report", *db, "--all-customers", "--write", "pdf", "-o", str(tmp_path)])
    assert result.exit_code == 2 and "--write: unknown format 'pdf'; use html, md or json" in result.output
    result = runner.invoke(cli, ["report", *db, "--all-customers", "--as", "pdf", "-o", str(tmp_path)])
    assert result.exit_code == 2 and "--as: unknown format 'pdf'; print as table or json" in result.output
    result = runner.invoke(cli, ["report", *db, "--run", "1", "--customer", "Nobody", "-o", str(tmp_path)])
    assert result.exit_code == 1 and "run 1 has no calls for customer 'Nobody'" in result.output
    result = runner.invoke(cli, ["report", *db, "--all-customers", "--max-call-drift", "lots"])
    assert result.exit_code == 2 and "'lots' is not a proportion; use 0.015 or 1.5%" in result.output



def test_parse_formats():
    assert parse_formats([]) == ["html", "md", "json"]
    assert parse_formats(["md,json", "html", "markdown"]) == ["md", "json", "html"]
