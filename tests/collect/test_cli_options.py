"""The `--collected` options of `replay` and `compare` refuse what they cannot mean (exit 2, a usage error)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from toolaudit.cli import cli


@pytest.mark.parametrize("args, message", [
    (["replay", "--sample", "3", "t.jsonl"], "select from --collected DIR"),
    (["replay", "--collected", "{dir}", "t.jsonl"], "not both"),
    (["replay", "--collected", "{dir}", "--per-customer"], "--per-customer needs --sample N"),
    (["replay", "--collected", "{dir}", "--resume", "1"], "--resume takes"),
    (["compare", "--collected", "{dir}", "a.jsonl", "b.jsonl"], "not both"),
    (["compare", "--baseline-service", "a", "--candidate-service", "b"], "select from --collected DIR"),
    (["compare", "a.jsonl"], "at least one candidate log"),
])
def test_usage_errors(tmp_path, args, message):
    args = [a.replace("{dir}", str(tmp_path)) for a in args]
    result = CliRunner().invoke(cli, [*args, "--db", str(tmp_path / "x.duckdb")])
    assert result.exit_code == 2 and message in result.output


def test_an_empty_folder_is_a_one_line_error(tmp_path):
    result = CliRunner().invoke(cli, ["replay", "--collected", str(tmp_path), "--since", "24h", "--db",
                                      str(tmp_path / "x.duckdb")])
    assert result.exit_code == 1 and f"no collected files in {tmp_path} in the last 24h" in result.output
