"""The Markdown rendering: data stays inside code spans and escaped pipes never split a table cell."""

from __future__ import annotations

import re

from click.testing import CliRunner

from toolaudit.cli import cli
from toolaudit.report.markdown import md_cell


def test_markdown_keeps_tables_intact(report_db, tmp_path):
    out = tmp_path / "r"
    CliRunner().invoke(cli, ["report", "--db", str(report_db), "--run", "1", "--customer", "Zephyr Logistics",
                             "-o", str(out)])
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
    for value in ["a|b", "a\\|b", "a\\\\|b", "a\\\\\\|b", "`|`", "x\\"]:
        for code in (False, True):
            assert gfm_cells(f"| {md_cell(value, code)} |") == 2, (value, code)
