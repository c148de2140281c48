"""SIGTERM (cron, systemd, Kubernetes) ends `compare` and `replay` as Ctrl-C does, from outside, for real.

Each command runs in a child process and is sent SIGTERM (a few points: SIGINT, as a terminal's Ctrl-C) at
seeded points of its progress: just before its N-th SQL statement (`killpoints.py`: the child blocks there
until the signal arrives, so the signal lands at that point; no sleeps). The command handles it and ends.
Checked at every point:

- exit status 143 (SIGTERM) or 130 (SIGINT), and a last line `interrupted (SIGTERM)...` that says what became
  of the run and the command that finishes it;
- the file: no run left `running` (the run is `interrupted`, or `complete` when the signal came after its
  last commit), no call without its outputs, nothing twice;
- the printed command, run as printed (`replay --resume RUN`; for a compare, the same command again), gives
  tables, views and `summary` figures equal to an uninterrupted run's, and an interrupted compare's rows are
  rolled back by it.

The points fall in the command's own work (the file is migrated beforehand); on a new file, a signal during
its migration leaves no file behind.

The replays run the echo engine of tests/plugins (no model); `tests/store/test_kill.py` covers the torch engine's
schedules under SIGKILL, which reach the database the same way.
"""

from __future__ import annotations

import re
import shlex
import signal
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import REPO
from killpoints import Launcher, points
from store.test_kill import PER_INVOCATION, TABLES, Scenario, check_invariants, fresh, inputs, latest_run, tables_of

from toolaudit.store import Store

__all__ = ["inputs"]  # the fixture, shared with tests/store/test_kill.py

SEED = 143
DEMO = REPO / "traces" / "demo.jsonl"
SAID = re.compile(r"^Error: interrupted \((SIG[A-Z]+)\)(.*)$", re.MULTILINE)


@pytest.fixture(scope="module")
def launcher(tmp_path_factory) -> Launcher:
    """Children of a fork server that imported toolaudit and DuckDB once (no torch: no model runs here)."""
    launcher = Launcher(tmp_path_factory.mktemp("sigterm-logs"))
    launcher.run(["--version"])
    return launcher


def compare_scenario(inputs: Path) -> Scenario:
    def argv(db: Path) -> list[str]:
        return ["compare", str(inputs / "base.jsonl"), str(inputs / "cand.jsonl"), "--db", str(db), "--schemas",
                str(REPO / "schemas"), "--json"]
    return Scenario("compare", argv, inputs / "empty.duckdb", _unused)


def replay_scenario(work: Path, inputs: Path) -> Scenario:
    demo = work / "demo8.jsonl"  # 8 calls: 4 chunks of 2
    demo.write_text("".join(DEMO.read_text().splitlines(keepends=True)[:8]))
    paths = work / "paths.toml"
    paths.write_text('[paths.echo-first]\nengine = "echo"\nmax_tokens = 32\n\n'
                     '[paths.echo-last]\nengine = "echo"\npick = "last"\nmax_tokens = 32\n')

    def argv(db: Path) -> list[str]:
        return ["replay", str(demo), "--paths", str(paths), "--baseline", "echo-first", "--candidate", "echo-last",
                "--chunk", "2", "--db", str(db), "--schemas", str(REPO / "schemas"), "--json"]
    return Scenario("replay", argv, inputs / "empty.duckdb", _unused, [t for t in TABLES if t not in PER_INVOCATION],
                    per_invocation=("counts",), setup="echo-engine")


def _unused(*_):  # Scenario.recover: here the command the interrupted one printed is the recovery
    raise AssertionError("not used")


def stop_and_finish(launcher: Launcher, scenario: Scenario, db: Path, n: int, sig: int, want: dict) -> str:
    """One point: `sig` before statement `n`; check the exit, the line and the file; run the printed command;
    check the result. Returns what the signal left."""
    outcome = launcher.run(scenario.argv(db), kill_at=n, setup=scenario.setup, signal=sig)
    assert not outcome.killed and outcome.exit_code == 128 + sig, (n, outcome.exit_code, outcome.output)
    said = SAID.findall(outcome.output)
    assert len(said) == 1 and said[0][0] == signal.Signals(sig).name, (n, outcome.output)
    line = said[0][1]
    if not db.exists():  # stopped before its first run row: the file it created is removed
        left = "no database"
        assert line.startswith(" before its run started; nothing was stored; run it again: toolaudit "), (n, line)
        assert shlex.split(line.split("run it again: ", 1)[1])[1:] == scenario.argv(db), (n, line)
    else:
        with Store(db, read_only=True) as store:
            statuses = check_invariants(store)
            assert "running" not in statuses.values(), (n, statuses)
            run_id = latest_run(db)
            if run_id is None:
                left = "no run row"
                assert " before its run started; nothing was stored; run it again: " in line, (n, line)
            else:
                left = statuses[run_id]
                if left == "complete":  # the signal came after its last commit: nothing to finish
                    assert tables_of(store, run_id, scenario) == want, (n, "complete but not whole")
                    assert line == (f" after run {run_id} completed; nothing is lost: toolaudit summary --run "
                                    f"{run_id} --db {db}"), (n, line)
                    return left
                assert left == "interrupted", (n, statuses)
                if scenario.name == "replay":
                    assert line == f"; finish it with: toolaudit replay --resume {run_id} --db {db}", (n, line)
                else:
                    assert line.startswith(f"; compare run {run_id} is rolled back when the database is next "
                                           "written (a comparison has nothing worth keeping); run it again: "
                                           "toolaudit "), (n, line)
    finish = shlex.split(re.split(r"run it again: |finish it with: ", line)[1])
    assert finish[0] == "toolaudit"
    done = launcher.run(finish[1:], setup=scenario.setup)
    assert done.exit_code == 0, (n, done.output)
    with Store(db, read_only=True) as store:
        statuses = check_invariants(store)
        assert set(statuses.values()) <= {"complete", "interrupted"}, (n, statuses)
        complete = [rid for rid, status in statuses.items() if status == "complete"]
        assert len(complete) == 1, (n, statuses)  # a resumed replay is the same run; a compare made one anew
        got = tables_of(store, complete[0], scenario)
        assert got == want, (n, {k: (got[k], want[k]) for k in want if got[k] != want[k]})
        unfinished = store.query("SELECT count(*) FROM calls JOIN runs USING (run_id) "
                                 "WHERE runs.status <> 'complete'")[1][0][0]
        assert unfinished == 0, (n, "an interrupted run kept rows after the re-run")
    return left


@pytest.mark.parametrize(("name", "sig", "count"), [("compare", signal.SIGTERM, 6), ("replay", signal.SIGTERM, 6),
                                                    ("replay", signal.SIGINT, 3)])
def test_signal_anywhere_then_finish_as_printed(tmp_path, launcher, inputs, show_table, name, sig, count):
    started = time.monotonic()
    scenario = compare_scenario(inputs) if name == "compare" else replay_scenario(tmp_path, inputs)
    reference = fresh(scenario.template, tmp_path / "reference.duckdb")
    clean = launcher.run(scenario.argv(reference), setup=scenario.setup)
    assert clean.exit_code == 0, clean.output
    with Store(reference, read_only=True) as store:
        want = tables_of(store, latest_run(reference), scenario)
    assert want["calls"] and want["outputs"]  # not vacuous
    chosen = points(SEED + sig + sum(map(ord, name)), clean.statements, count)
    with ThreadPoolExecutor(2) as pool:  # each point in its own file
        left = Counter(pool.map(lambda n: stop_and_finish(launcher, scenario, fresh(scenario.template,
                                                                                     tmp_path / f"stop{n}.duckdb"),
                                                          n, sig, want), chosen))
    assert left["interrupted"] >= 1, left  # the case that matters was reached
    show_table("\n".join([
        f"{signal.Signals(sig).name}: {name} ({clean.statements} statements uninterrupted; signalled before "
        f"statement {', '.join(map(str, chosen))})",
        *[f"  {state:<24}{k:>4}" for state, k in sorted(left.items())],
        f"  exit {128 + sig} every time; finished by the printed command, equal to the uninterrupted run "
        f"{len(chosen)}/{len(chosen)}; {time.monotonic() - started:.1f} s"]))


def test_sigterm_while_a_new_file_is_migrated_leaves_no_file(tmp_path, launcher, inputs):
    """Statement 1 on a new file is its first migration: the file the command created goes with it."""
    scenario = compare_scenario(inputs)
    reference = fresh(None, tmp_path / "reference.duckdb")
    assert launcher.run(scenario.argv(reference)).exit_code == 0
    with Store(reference, read_only=True) as store:
        want = tables_of(store, latest_run(reference), scenario)
    for sig in (signal.SIGTERM, signal.SIGINT):
        db = fresh(None, tmp_path / f"new-{sig}.duckdb")
        assert stop_and_finish(launcher, scenario, db, 1, sig, want) == "no database"
