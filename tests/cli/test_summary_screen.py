"""`summary` (and the run view `replay`, `demo` and `compare` print) fits one screen: the verdict first, a few rows
per table, then `and N more: <command>` whose command shows every row; tools keyed by the recorded call's tool,
never by a name a decode path invented; `--json` keeps every key. And engines' progress bars stay off the terminal
unless `--verbose`."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest
from click.testing import CliRunner
from conftest import CLOSE_TOOL, REPO, SEARCH_TOOL, line, tool_call, write_jsonl

from toolaudit.cli import cli
from toolaudit.store import Store


def declared(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "description": name, "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}, "limit": {"type": "integer"}}}}}


TOOLS = [SEARCH_TOOL, CLOSE_TOOL, declared("get_quote"), declared("submit_order"), declared("reserve_flight"),
         declared("lock_doors")]
# Calls per recorded tool (120 in all): three busy tools, three with fewer than 5 calls; and two names no request
# declares, as a small model's answer invents them (`2025_q4`, `sell_304.5`).
PLAN = ([("search_tickets", 60)] + [("close_ticket", 30)] + [("get_quote", 12)] + [("submit_order", 8)]
        + [("reserve_flight", 4)] + [("lock_doors", 3)] + [("2025_q4", 2)] + [("sell_304.5", 1)])
CUSTOMERS = ["acme", "globex", "initech", "umbrella", "hooli", "stark"]  # more than one screen shows


def arguments(name: str, limit: int) -> dict:
    return {"query": "q", "limit": limit} if name == "search_tickets" else \
        {"ticket_id": limit} if name == "close_ticket" else {"q": "x", "limit": limit}


def logs(tmp_path):
    """A baseline log, a candidate drifting on every 10th call (the limit changes, or, every 30th, the tool name to
    one it invents) and a floor drifting on every 20th call."""
    names = [name for name, n in PLAN for _ in range(n)]

    def log(label, drifts):
        rows = []
        for i, name in enumerate(names):
            changed = drifts(i)
            called = "search_tix" if changed == "name" else name
            rows.append(line(session=f"s{i // 4:03d}", customer=CUSTOMERS[(i // 4) % len(CUSTOMERS)], tools=TOOLS,
                             calls=[tool_call(called, arguments(name, 50 if changed else 5))]))
        return str(write_jsonl(tmp_path / f"{label}.jsonl", rows))

    return (log("base", lambda i: None),
            log("cand", lambda i: "name" if i % 30 == 0 else "limit" if i % 10 == 0 else None),
            log("floor", lambda i: "limit" if i % 20 == 5 else None))


@pytest.fixture
def run(tmp_path):
    """A compare matrix of the candidate and its floor (marked as such, as `replay --noise-floor` does): the
    candidate's run id and the database."""
    base, cand, floor = logs(tmp_path)
    db = str(tmp_path / "s.duckdb")
    made = CliRunner().invoke(cli, ["compare", base, cand, floor, "--candidate-name", "spec", "--candidate-name",
                                    "spec-floor", "--db", db])
    assert made.exit_code == 0, made.output
    with Store(db) as store:
        _, spec, floor_run = (r["run_id"] for r in store.rows("SELECT run_id FROM runs ORDER BY run_id"))
        store.update_options(floor_run, {"noise_floor": True})
    return spec, db


def summary(db: str, *args: str) -> str:
    result = CliRunner().invoke(cli, ["summary", "--db", db, *args])
    assert result.exit_code == 0, result.output
    return result.output


def more_commands(text: str) -> list[list[str]]:
    """The commands of the `and N more ...: <command>` lines."""
    return [shlex.split(row.split(": ", 1)[1]) for row in text.splitlines() if row.startswith("  and ")]


def table(text: str, header: str) -> list[str]:
    """The first cells of the rows of the table whose header starts with `header` (up to the next blank line)."""
    lines = text.splitlines()
    start = next(i for i, row in enumerate(lines) if row.startswith(header))
    rows = []
    for row in lines[start + 2:]:
        if not row.strip() or row.startswith("  and "):
            break
        rows.append(row[:row.index("  ")] if "  " in row else row)
    return rows


def test_the_run_fits_one_screen_verdict_first(run):
    spec, db = run
    text = summary(db, "--run", str(spec))
    lines = text.splitlines()
    assert len(lines) <= 32, text
    assert lines[0].startswith(f"run {spec} ")
    # the verdict in words first: drifted of compared (rate, CI), the floor, the excess (CI), what it means
    assert lines[1].startswith("  drifted calls         12 of 120 compared (10.00%, 95% CI ")
    assert lines[2].startswith("  noise floor           6 (5.00%, 95% CI ")
    assert lines[3].startswith("  beyond the floor      +5.00pp (95% CI ")
    assert lines[4].startswith("  verdict               spec: ") and "batching noise" in lines[4]
    assert text.index("verdict") < text.index("customer ") and text.index("verdict") < text.index("tool ")


def test_tables_show_a_few_rows_then_the_command_for_the_rest(run):
    spec, db = run
    text = summary(db, "--run", str(spec))
    tools = table(text, "tool ")
    # the busiest recorded tools, then the rest folded: three tools under 5 calls and the two invented names
    assert tools == ["search_tickets", "close_ticket", "(6 more tools)"], text
    assert len(table(text, "customer ")) == 3
    commands = more_commands(text)
    assert [c[:4] for c in commands] == [["toolaudit", "summary", "--run", str(spec)]] * 2, text
    assert "and 6 more tools: " in text and "and 3 more customers: " in text
    everything = summary(db, *commands[0][2:])  # the command as printed
    assert more_commands(everything) == []
    assert table(everything, "tool ") == [name for name, _ in PLAN]  # every recorded tool, most calls first
    assert sorted(table(everything, "customer ")) == sorted(CUSTOMERS)


def test_the_folded_row_holds_the_figures_of_its_calls_together(run):
    spec, db = run
    data = json.loads(summary(db, "--run", str(spec), "--json"))
    keyed = {t["tool_name"]: t for t in data["noise_floor"]["tools_keyed"]}
    rest = [keyed[name] for name, _ in PLAN[2:]]
    text = summary(db, "--run", str(spec))
    folded = next(row for row in text.splitlines() if row.startswith("(6 more tools)"))
    assert folded.split()[3] == str(sum(t["calls"] for t in rest))  # 12 + 8 + 4 + 3 + 2 + 1
    small = json.loads(summary(db, "--run", str(spec), "--json"))["tools"]
    assert {t["tool_name"]: t["calls"] for t in small} == dict(PLAN)


def test_tools_are_keyed_by_the_recorded_call_not_an_invented_name(run):
    spec, db = run
    # compare: the baseline log is the recording; the candidate's invented `search_tix` is never a row
    everything = summary(db, "--run", str(spec), "--all")
    assert "search_tix" not in "\n".join(table(everything, "tool "))
    with Store(db) as store:  # the baseline log's first tool call is stored as the recorded call's
        assert store.query("SELECT count(*) FROM calls WHERE run_id = ? AND recorded_tool = tool_name",
                           [spec])[1] == [(120,)]
    # a replay (its calls keyed by the recorded call's tool) whose decoded baseline answered other names: keyed by
    # the recorded call still, and its JSON says so
    with Store(db) as store:
        store.con.execute("UPDATE runs SET kind = 'replay' WHERE run_id = ?", [spec])
        store.con.execute("UPDATE calls SET tool_name = 'x_' || tool_name WHERE run_id = ?", [spec])
    data = json.loads(summary(db, "--run", str(spec), "--json"))
    assert data["tool_key"] == "recorded"
    assert {t["tool_name"]: t["calls"] for t in data["tools"]} == dict(PLAN)
    assert {t["tool_name"]: t["calls"] for t in data["noise_floor"]["tools_keyed"]} == dict(PLAN)
    # a replay written before `recorded_tool` (migration 12): its baseline is a decode path, and a name no schema
    # knows (no request declares it) is `(other)`
    with Store(db) as store:
        store.con.execute("UPDATE calls SET tool_name = substr(tool_name, 3), recorded_tool = NULL WHERE run_id = ?",
                          [spec])
    everything = summary(db, "--run", str(spec), "--all")
    rows = table(everything, "declared tool ")
    assert "2025_q4" not in rows and "sell_304.5" not in rows
    assert rows == ["search_tickets", "close_ticket", "get_quote", "submit_order", "reserve_flight", "(other)",
                    "lock_doors"]
    data = json.loads(summary(db, "--run", str(spec), "--json"))
    assert data["tool_key"] == "declared"
    other = next(t for t in data["tools"] if t["tool_name"] == "(other)")
    assert other["calls"] == 3
    # the figures by the baseline's own names are still there, unchanged
    assert {t["tool_name"] for t in data["noise_floor"]["tools"]} == {name for name, _ in PLAN}


OLD_KEYS = {"run_id", "run_name", "status", "baseline", "candidate", "calls", "drifted_calls", "drift_rate", "ci_low",
            "ci_high", "exact_text_matches", "drift_kinds", "unmatched_calls", "not_compared", "error_rows",
            "first_errors", "errors_sql", "skipped", "schema_problems", "schema_issues_sql", "sessions",
            "sessions_with_drift", "observed_session_drift", "compounded_session_drift_run_rates",
            "compounded_session_drift", "mean_calls_per_session", "expected_session_drift", "paths", "speedup",
            "drifted_with_token_evidence", "median_drift_margin", "worst_example", "customers", "counts",
            "noise_floor", "sampling", "samples_per_call", "shifted_calls", "global_p", "sampled"}
OLD_FLOOR_KEYS = {"floor_run_id", "floor_path", "calls", "candidate", "floor", "excess", "only_candidate",
                  "only_floor", "both", "tool_name", "tools"}


def test_json_keeps_every_key_and_row(run):
    spec, db = run
    data = json.loads(summary(db, "--run", str(spec), "--json"))
    assert OLD_KEYS <= set(data) and OLD_FLOOR_KEYS <= set(data["noise_floor"])
    assert len(data["customers"]) == len(CUSTOMERS) and len(data["noise_floor"]["tools"]) == len(PLAN)
    assert (data["calls"], data["drifted_calls"]) == (120, 12)
    assert data["noise_floor"]["excess"]["estimate"] == pytest.approx(0.05)


def test_a_run_without_a_floor_says_so_and_keeps_its_tool_table(tmp_path):
    base, cand, _ = logs(tmp_path)
    db = str(tmp_path / "p.duckdb")
    made = CliRunner().invoke(cli, ["compare", base, cand, "--db", db])
    assert made.exit_code == 0, made.output
    lines = made.output.splitlines()
    assert len(lines) <= 32, made.output
    assert lines[2].startswith("  verdict               ") and "without a noise floor" in lines[2]
    assert table(made.output, "tool ") == ["search_tickets", "close_ticket", "(6 more tools)"]


PROGRESS = """
import sys
from toolaudit.engines.logs import EngineLogs
if sys.argv[1] == "before":
    import transformers.utils.logging
logs = EngineLogs(None if sys.argv[2] == "verbose" else sys.argv[2])
import transformers.utils.logging as tf
from tqdm.auto import tqdm
for _ in tf.tqdm(range(3), desc="Loading weights"):
    pass
for _ in tqdm(range(3), desc="a plain tqdm bar"):
    pass
print("enabled" if tf.is_progress_bar_enabled() else "disabled")
"""


@pytest.mark.parametrize("imported", ["before", "after"])
def test_progress_bars_stay_off_the_terminal_unless_verbose(tmp_path, imported):
    """Transformers' bar ("Loading weights", drawn outside `captured()` where a probe loads its engine) reaches no
    terminal, whether transformers was imported before the command chose its log file or after; a plain tqdm bar
    neither, where tqdm is imported after (and in the processes started: vLLM's engine core). `--verbose` (no
    file) keeps them."""
    # the environment of a fresh shell: a replay run in this process before (CliRunner) turned bars off for the
    # rest of it and the processes it starts (`engines.logs.quiet_progress_bars`)
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_DISABLE_PROGRESS_BARS", "TQDM_DISABLE")}

    def bars(where):
        done = subprocess.run([sys.executable, "-c", PROGRESS, imported, where], cwd=REPO, capture_output=True,
                              text=True, timeout=120, check=True, env=env)
        return done.stdout.strip(), done.stderr
    said, err = bars(str(tmp_path / "x.engines.log"))
    assert said == "disabled" and "Loading weights" not in err, err
    assert imported == "before" or "plain tqdm" not in err, err
    said, err = bars("verbose")
    assert said == "enabled" and "Loading weights" in err and "plain tqdm" in err


@pytest.mark.parametrize(("low", "high", "drifted", "says"), [
    (-0.03, 0.14, 4, "within batching noise (the excess's 95% CI contains 0"),
    (0.02, 0.20, 9, "beyond batching noise (the excess's 95% CI is above 0)"),
    (-0.20, -0.01, 1, "below the noise floor"),
    (0.0, 0.0, 0, "no call drifted (the 95% CI reaches 9.64%"),
])
def test_the_verdict_says_what_the_excess_means(low, high, drifted, says):
    from toolaudit.report.terminal import verdict

    s = {"candidate": "spec", "speedup": 2.5, "drifted_calls": drifted, "ci_high": 0.0964,
         "noise_floor": {"excess": {"estimate": (low + high) / 2, "low": low, "high": high}}}
    assert verdict(s).startswith("spec: 2.50x the baseline's tokens/s; ") and says in verdict(s)
