"""Never a silent nothing: `compare` fails, with the reason and the likely fix, when the logs pair no calls or
far fewer than they hold (each recording's calls keyed by different sessions), and still stores the run."""

from __future__ import annotations

import json

from click.testing import CliRunner
from conftest import line, tool_call, write_jsonl

from toolaudit.cli import cli


def calls(prefix: str, sessions: int, per_session: int = 2) -> list[dict]:
    return [line(session=f"{prefix}{s}", calls=[tool_call("search_tickets", {"query": f"q{s}-{c}", "limit": 50})])
            for s in range(sessions) for c in range(per_session)]


def compare(tmp_path, baseline: list[dict], candidate: list[dict]):
    a = write_jsonl(tmp_path / "a.jsonl", baseline)
    b = write_jsonl(tmp_path / "b.jsonl", candidate)
    db = tmp_path / "audit.duckdb"
    result = CliRunner().invoke(cli, ["compare", str(a), str(b), "--db", str(db)])
    return result, db


def test_no_paired_call_fails_with_the_reason_and_the_fix(tmp_path):
    result, db = compare(tmp_path, calls("trace-a-", 3), calls("trace-b-", 3))
    assert result.exit_code == 1, result.output
    assert "no calls paired between the logs (baseline 6 calls, candidate 6" in result.output
    assert "--session-key session.id" in result.output
    summary = CliRunner().invoke(cli, ["summary", "--db", str(db), "--json"])  # the run is stored all the same
    assert summary.exit_code == 0 and json.loads(summary.output)


def test_far_fewer_pairs_than_calls_fail(tmp_path):
    baseline = calls("s", 4)
    candidate = calls("s", 1) + calls("other-", 3)  # 2 of 8 calls pair
    result, _ = compare(tmp_path, baseline, candidate)
    assert result.exit_code == 1 and "only 2 calls paired" in result.output


def test_a_normal_comparison_passes(tmp_path):
    baseline = calls("s", 4)
    result, _ = compare(tmp_path, baseline, baseline[:-1])  # one call missing: 7 of 8 pair
    assert result.exit_code == 0, result.output
