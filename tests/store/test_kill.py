"""kill -9 anywhere: `compare`, `replay` (torch engine: 6 points call-major, 6 path-major), `merge` and
`batch import`, each SIGKILLed at 12 seeded points of its progress (`killpoints.py`: just before its N-th SQL
statement, one N drawn from each twelfth of the statements of an uninterrupted run), then recovered as a user
would: `replay --resume RUN` (or the command again, when the kill came before the run row), the same `compare`,
`merge` or `batch import` again.

Promise checked, at every point:
- right after the kill: no call row lacks its outputs rows, nothing is stored twice, and a run that says
  `complete` is whole (its tables equal the uninterrupted run's);
- after the recovery: the run's tables, views and `summary --json` figures equal the uninterrupted run's (run
  ids, names, times and wall-clock figures aside), no run is left `running`, and a compare run that did not
  finish holds no rows (rolled back by the next writer: `toolaudit.store.recovery`).

Each test prints a table: kill points, where the kills left the run, how it was recovered, and what was equal.
vLLM replays are not killed here (vLLM on CPU takes ~30 s per start, and 12 points need 24 starts): the
path-major torch replay runs the schedule they run, and what reaches the database does not depend on the engine.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from compare.test_shards import rows_of
from conftest import REPO, line, tool_call, write_jsonl
from helpers import build_tiny_model, torch_path_toml
from killpoints import PRELOAD, Launcher, points
from replay.test_batch import batch_output

from toolaudit.analysis.figures import run_summary
from toolaudit.store import Store

POINTS = 12  # one per twelfth of the command's statements (killpoints.points)
SEED = 2025
DEMO = REPO / "traces" / "demo.jsonl"
# wall-clock columns and figures, and run ids (`frontier` names a run's own id as its matrix), left out of every
# comparison (`rows_of` leaves out run_id and run_name)
TIMING = ("latency_s", "ttft_s", "tokens_per_s", "wall_s", "reused_prefill_s", "speedup", "wall_share_s",
          "created_at", "finished_at", "baseline_tokens_per_s", "candidate_tokens_per_s", "matrix_id")
# every table and view keyed by run
TABLES = ["calls", "outputs", "arg_diffs", "sessions", "trace_errors", "schema_issues", "staged_results",
          "replay_chunks", "call_drift", "session_drift", "customer_drift", "tool_drift", "argument_drift",
          "path_performance", "frontier", "customer_frontier"]
# a resumed replay's work per invocation (its first invocation's chunks count there too), and the views whose
# decoding figures (acceptance, tokens per forward pass) are summed from it
PER_INVOCATION = ("replay_chunks", "path_performance", "frontier", "customer_frontier")


@dataclass
class Scenario:
    """One command under kills: its argv for a database, the database it starts from (None: a new one), how
    a user recovers after a kill, and which run holds the result."""

    name: str
    argv: Callable[[Path], list[str]]
    template: Path | None
    recover: Callable[[Launcher, Path, str | None], str]  # runs the recovery (setup); returns how
    tables: list[str] = field(default_factory=lambda: list(TABLES))
    run: int | None = None  # the run that holds the result (None: the command's new run)
    once: bool = False  # the command makes one run however often it runs
    # summary figures that say what each invocation did (a recovery did less: e.g. "already paired")
    per_invocation: tuple[str, ...] = ()
    setup: str | None = None  # killpoints.SETUPS: run in each child first
    points: int = POINTS


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("kill-tiny") / "tiny")


@pytest.fixture(scope="module")
def launcher(tmp_path_factory, tiny_model) -> Launcher:
    """Children of one fork server that imported toolaudit and torch and loaded the tiny model (`killwarm`)."""
    before = os.environ.get("TOOLAUDIT_KILL_WARM")
    os.environ["TOOLAUDIT_KILL_WARM"] = str(tiny_model)  # read as the fork server starts (its first child)
    launcher = Launcher(tmp_path_factory.mktemp("kill-logs"),
                        [*PRELOAD, "torch", "transformers", "toolaudit.engines.torch.engine", "killwarm"])
    launcher.run(["--version"])
    if before is None:
        del os.environ["TOOLAUDIT_KILL_WARM"]
    else:
        os.environ["TOOLAUDIT_KILL_WARM"] = before
    return launcher


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """Two small logs with every kind of row: agreeing and drifting pairs, a call in one log only, a bad line
    and a repeated key (few distinct schemas, so a compare takes a fraction of a second)."""
    root = tmp_path_factory.mktemp("kill-inputs")
    base, cand = [], []
    for s in range(12):
        for i in range(2):
            args = {"query": f"tickets {s}.{i}", "limit": 5}
            other = {**args, "limit": 6} if (s + i) % 5 == 1 else args
            content = "same" if s % 3 else None
            base.append(line(f"s{s}", f"c{s % 3}", [tool_call("search_tickets", args)], content, i))
            cand.append(line(f"s{s}", f"c{s % 3}", [tool_call("search_tickets", other)],
                             "changed" if s == 4 else content, i))
    base.append(line("only-base", "c0", [tool_call("close_ticket", {"ticket_id": 3})], call_index=0))
    cand.append(line("only-cand", "c1", [tool_call("close_ticket", {"ticket_id": "x"})], call_index=0))
    cand.append("{not json")
    cand.append(line("s0", "c0", [tool_call("search_tickets", {"query": "again"})], call_index=0))
    write_jsonl(root / "base.jsonl", base)
    write_jsonl(root / "cand.jsonl", cand)
    Store(root / "empty.duckdb").close()  # migrated once: the kills fall in the command's own work
    return root


def fresh(template: Path | None, db: Path) -> Path:
    for leftover in (db, Path(f"{db}.wal"), Path(f"{db}.snapshot")):
        leftover.unlink(missing_ok=True)
    if template is not None:
        shutil.copyfile(template, db)
    return db


def latest_run(db: Path, kind: str | None = None) -> int | None:
    with Store(db, read_only=True) as store:
        return store.query("SELECT max(run_id) FROM runs WHERE matrix_id IS NULL AND (? IS NULL OR kind = ?)",
                           [kind, kind])[1][0][0]


def _strip(value):
    """`summary --json` without run ids, names and times."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items()
                if k not in ("run_id", "run_name", "errors_sql", "schema_issues_sql", *TIMING) and not k.endswith("_s")}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def tables_of(store: Store, run_id: int, scenario: Scenario) -> dict:
    """Every table and view of the run, its status and kind, and the figures of `summary --json` (the same
    `run_summary`), comparable across runs."""
    got = {t: rows_of(store, t, run_id, TIMING) for t in scenario.tables}
    run = store.run_row(run_id)
    summary = _strip(json.loads(json.dumps(run_summary(store, run_id), default=str)))
    got["summary"] = {k: v for k, v in summary.items() if k not in scenario.per_invocation}
    got["run"] = (run["kind"], run["status"], run["baseline_name"], run["candidate_name"])
    return got


def check_invariants(store: Store) -> dict[int, str]:
    """No call lacks its outputs rows, nothing twice, no outputs of a finished run (or of a replay or batch
    run, written call by call) without its call. Returns run id -> status."""
    lacking = store.query("""
        SELECT count(*) FROM calls c WHERE
          (c.match_status <> 'candidate_only' AND NOT EXISTS (SELECT 1 FROM outputs o WHERE o.run_id = c.run_id
           AND o.session_id = c.session_id AND o.call_index = c.call_index AND o.side = 'baseline'))
          OR (c.match_status <> 'baseline_only' AND NOT EXISTS (SELECT 1 FROM outputs o
           WHERE o.run_id = c.run_id AND o.session_id = c.session_id AND o.call_index = c.call_index
           AND o.side = 'candidate'))""")[1][0][0]
    orphans = store.query("""
        SELECT count(*) FROM outputs o JOIN runs r USING (run_id) WHERE (r.status = 'complete' OR
          r.kind <> 'compare') AND NOT EXISTS (SELECT 1 FROM calls c WHERE c.run_id = o.run_id
          AND c.session_id = o.session_id AND c.call_index = o.call_index)""")[1][0][0]
    duplicated = sum(store.query(f"SELECT count(*) - count(DISTINCT ({key})) FROM {table}")[1][0][0]
                     for table, key in (("calls", "run_id, session_id, call_index"),
                                        ("outputs", "run_id, session_id, call_index, side")))
    assert (lacking, duplicated, orphans) == (0, 0, 0), "calls lacking outputs, duplicated rows, orphan outputs"
    return {r[0]: r[1] for r in store.query("SELECT run_id, status FROM runs")[1]}


def kill_and_recover(launcher: Launcher, scenario: Scenario, db: Path, n: int, want: dict,
                     template_runs: set[int]) -> tuple[str, str]:
    """One point: kill before statement `n`, check the file, recover, check the result. Returns (what the kill
    left, how it was recovered)."""
    outcome = launcher.run(scenario.argv(db), kill_at=n, setup=scenario.setup)
    assert outcome.killed or outcome.exit_code == 0, outcome.output
    left = "no database"
    if db.exists():
        with Store(db, read_only=True) as store:
            statuses = check_invariants(store)
            mine = {rid: s for rid, s in statuses.items() if rid not in template_runs or rid == scenario.run}
            left = "/".join(sorted(set(mine.values()))) or "no run row"
            for rid, status in mine.items():  # a run that says complete is whole already
                if status == "complete":
                    assert tables_of(store, rid, scenario) == want, (n, "complete but not whole")
    how = scenario.recover(launcher, db, scenario.setup)
    with Store(db, read_only=True) as store:
        statuses = check_invariants(store)
        assert "running" not in statuses.values(), (n, statuses)
        result_run = scenario.run or max(rid for rid in statuses if rid not in template_runs)
        got = tables_of(store, result_run, scenario)
        assert got == want, (n, {k: (got[k], want[k]) for k in want if k != "summary" and got[k] != want[k]},
                             {k: (v, want["summary"].get(k)) for k, v in got["summary"].items()
                              if v != want["summary"].get(k)})
        unfinished = store.query("SELECT count(*) FROM calls JOIN runs USING (run_id) "
                                 "WHERE runs.status <> 'complete'")[1][0][0]
        assert unfinished == 0, (n, "an unfinished run kept rows")
        if scenario.once:  # made once, however often the command ran
            assert len(set(statuses) - template_runs) == 1, (n, statuses)
    return left, how


def run_kills(launcher: Launcher, scenario: Scenario, work: Path, show_table) -> None:
    """The uninterrupted run, then every kill point (two at a time: each runs in its own file)."""
    started = time.monotonic()
    reference = fresh(scenario.template, work / "reference.duckdb")
    clean = launcher.run(scenario.argv(reference), setup=scenario.setup)
    assert clean.exit_code == 0 and not clean.killed, clean.output
    template_runs = set()
    if scenario.template is not None:
        with Store(scenario.template, read_only=True) as store:
            template_runs = set(check_invariants(store))
    with Store(reference, read_only=True) as store:
        want = tables_of(store, scenario.run or latest_run(reference), scenario)
    assert want["calls"] and want["outputs"]  # not vacuous
    chosen = points(SEED + sum(map(ord, scenario.name)), clean.statements, scenario.points)
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda n: kill_and_recover(launcher, scenario, fresh(scenario.template,
                                                                                   work / f"kill{n}.duckdb"),
                                                        n, want, template_runs), chosen))
    after_kill, recovered_by = Counter(left for left, _ in done), Counter(how for _, how in done)
    table = [f"kill -9: {scenario.name} ({clean.statements} statements uninterrupted; killed before statement "
             f"{', '.join(map(str, chosen))})",
             f"  {'left by the kill':<34}{'points':>7}",
             *[f"  {state:<34}{k:>7}" for state, k in sorted(after_kill.items())],
             f"  recovered by: {', '.join(f'{how} {k}' for how, k in sorted(recovered_by.items()))}; "
             f"equal to the uninterrupted run {len(done)}/{len(chosen)}; calls lacking outputs 0, duplicated 0; "
             f"{time.monotonic() - started:.1f} s"]
    show_table("\n".join(table))


def _compare_argv(inputs: Path) -> Callable[[Path], list[str]]:
    return lambda db: ["compare", str(inputs / "base.jsonl"), str(inputs / "cand.jsonl"), "--db", str(db),
                       "--schemas", str(REPO / "schemas"), "--json"]


def _again(argv: Callable[[Path], list[str]]) -> Callable[[Launcher, Path, str | None], str]:
    def recover(launcher: Launcher, db: Path, setup: str | None) -> str:
        outcome = launcher.run(argv(db), setup=setup)
        assert outcome.exit_code == 0, outcome.output
        return "re-run"
    return recover


def test_kill_compare_anywhere_then_compare_again(tmp_path, launcher, inputs, show_table):
    argv = _compare_argv(inputs)
    run_kills(launcher, Scenario("compare", argv, inputs / "empty.duckdb", _again(argv)), tmp_path, show_table)


@pytest.fixture(scope="module")
def tiny_paths(tiny_model) -> Path:
    path = tiny_model.parent / "paths.toml"
    # one thread each: two replays run side by side on 2 cores, and no 0.2 s measurement of the free cores
    path.write_text(torch_path_toml("tiny", tiny_model, batch_size=2, max_tokens=4) + "threads = 1\n"
                    + torch_path_toml("tiny-spec", tiny_model, batch_size=2, max_tokens=4, speculative=True)
                    + "threads = 1\n")
    return path


@pytest.mark.parametrize("schedule", [None, "path-major"])
def test_kill_torch_replay_anywhere_then_resume(tmp_path, launcher, inputs, tiny_paths, show_table, schedule):
    """12 points in all, 6 per schedule: call-major (both paths per chunk, as torch runs) and path-major (one
    path over every call, its results staged, then the other: how vLLM replays run, its engines not being held
    together). Half each keeps the suite in its time budget; the replay's statements are the same per chunk."""
    demo = tmp_path / "demo6.jsonl"  # 6 calls: 3 chunks of 2
    demo.write_text("".join(DEMO.read_text().splitlines(keepends=True)[:6]))

    def argv(db: Path) -> list[str]:
        return ["replay", str(demo), "--paths", str(tiny_paths), "--baseline", "tiny", "--candidate", "tiny-spec",
                "--chunk", "2", "--db", str(db), "--schemas", str(REPO / "schemas"), "--json"]

    def recover(launcher: Launcher, db: Path, setup: str | None) -> str:
        run_id = latest_run(db, "replay")
        if run_id is None:  # killed before its run row: nothing to resume
            return _again(argv)(launcher, db, setup)
        outcome = launcher.run(["replay", "--resume", str(run_id), "--db", str(db), "--json"], setup=setup)
        assert outcome.exit_code == 0, outcome.output
        return "resumed"

    tables = [t for t in TABLES if t not in PER_INVOCATION]
    name = "replay (torch" + (", path-major)" if schedule else ")")
    run_kills(launcher, Scenario(name, argv, inputs / "empty.duckdb", recover, tables, per_invocation=("counts",),
                                 setup=schedule, points=POINTS // 2), tmp_path, show_table)


def test_kill_merge_anywhere_then_merge_again(tmp_path, launcher, inputs, show_table):
    shards = []
    for k in (1, 2):
        shards.append(fresh(inputs / "empty.duckdb", tmp_path / f"shard{k}.duckdb"))
        done = launcher.run([*_compare_argv(inputs)(shards[-1]), "--shard", f"{k}/2"])
        assert done.exit_code == 0, done.output

    def argv(db: Path) -> list[str]:
        return ["merge", str(shards[1]), str(shards[0]), "--db", str(db), "--json"]

    run_kills(launcher, Scenario("merge", argv, inputs / "empty.duckdb", _again(argv), once=True), tmp_path, show_table)


def test_kill_batch_import_anywhere_then_import_again(tmp_path, launcher, inputs, tiny_paths, show_table):
    from replay.test_batch import recorded

    requests, results = {}, {}
    for side, path, log in (("baseline", "tiny", "base.jsonl"), ("candidate", "tiny-spec", "cand.jsonl")):
        requests[side] = tmp_path / f"req-{side}.jsonl"
        done = launcher.run(["batch", "export", str(inputs / "base.jsonl"), "--path", path, "--paths",
                             str(tiny_paths), "-o", str(requests[side])])
        assert done.exit_code == 0, done.output
        lines = [json.loads(x) for x in requests[side].read_text().splitlines()]
        answers = {k: c.response for k, c in recorded(inputs / log).items()}
        results[side] = tmp_path / f"res-{side}.jsonl"
        first = sorted(answers)[0]
        batch_output(lines, answers, results[side], errors={first: {"message": "boom"}} if side == "candidate"
                     else {})
    template = fresh(inputs / "empty.duckdb", tmp_path / "baseline-imported.duckdb")
    done = launcher.run(["batch", "import", str(requests["baseline"]), str(results["baseline"]), "--side",
                         "baseline", "--path", "tiny", "--paths", str(tiny_paths), "--db", str(template)])
    assert done.exit_code == 0, done.output

    def argv(db: Path) -> list[str]:
        return ["batch", "import", str(requests["candidate"]), str(results["candidate"]), "--side", "candidate",
                "--path", "tiny-spec", "--paths", str(tiny_paths), "--run", "1", "--db", str(db),
                "--schemas", str(REPO / "schemas"), "--json"]

    run_kills(launcher, Scenario("batch import", argv, template, _again(argv), run=1, per_invocation=("counts",)),
              tmp_path, show_table)


def test_next_writer_settles_the_runs_a_dead_process_left(tmp_path, inputs, monkeypatch):
    """In process: a compare interrupted after its first write keeps its rows until the next writer opens the
    file, which deletes them and says so in the run's counts; a replay left running is marked interrupted; the
    runs this process is still writing (another Store on the same file) are left alone."""
    from toolaudit.compare.logs import CompareOptions, compare_logs
    from toolaudit.store.recovery import LIVE, live_key
    from toolaudit.store.staging import Staging

    db = tmp_path / "c.duckdb"
    original = Staging.write_agreeing

    def interrupted(self, *args, **kwargs):
        original(self, *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(Staging, "write_agreeing", interrupted)
    with Store(db) as store, pytest.raises(KeyboardInterrupt):
        compare_logs(store, inputs / "base.jsonl", inputs / "cand.jsonl", CompareOptions(schema_dir=None))
    monkeypatch.undo()
    with Store(db, read_only=True) as store:  # a reader sees what was written, marked interrupted
        assert store.run_row(1)["status"] == "interrupted"
        assert store.query("SELECT count(*) FROM calls WHERE run_id = 1")[1][0][0] > 0
    with Store(db) as store:
        run = store.run_row(1)
        assert (run["status"], json.loads(run["counts"])) == ("interrupted", {"rolled_back": True})
        for table in ("calls", "outputs", "arg_diffs", "trace_errors", "schema_issues", "sessions"):
            assert store.query(f"SELECT count(*) FROM {table}")[1][0][0] == 0, table
        live = store.create_run("compare", None, "b", "c", "b.jsonl", "c.jsonl", {})
        replay = store.create_run("replay", None, "b", "c", "b", "c", {})
        with Store(db) as second:  # the same process: its runs are not a dead writer's
            assert second.run_row(live)["status"] == second.run_row(replay)["status"] == "running"
        LIVE.discard(live_key(str(db), replay))  # as if its process had died
    with Store(db) as store:  # a replay left running is interrupted (resumable), a compare rolled back
        assert store.run_row(replay)["status"] == "interrupted" and store.run_row(replay)["counts"] is None
        assert store.run_row(live)["status"] == "running"  # still this process's


def test_merging_the_same_runs_again_adds_no_run(tmp_path, inputs):
    from click.testing import CliRunner

    from toolaudit.cli import cli

    shards = []
    for k in (1, 2):
        shards.append(tmp_path / f"s{k}.duckdb")
        result = CliRunner().invoke(cli, ["compare", str(inputs / "base.jsonl"), str(inputs / "cand.jsonl"),
                                          "--db", str(shards[-1]), "--shard", f"{k}/2", "--schemas", ""])
        assert result.exit_code == 0, result.output
    merged = tmp_path / "m.duckdb"
    first = CliRunner().invoke(cli, ["merge", *map(str, shards), "--db", str(merged)])
    again = CliRunner().invoke(cli, ["merge", *map(str, shards), "--db", str(merged)])
    assert first.exit_code == again.exit_code == 0, again.output
    assert "shards 1, 2 of 2 merged into run 1" in first.stderr
    assert "shards 1, 2 of 2 were merged before into run 1" in again.stderr
    with Store(merged, read_only=True) as store:
        assert store.query("SELECT count(*) FROM runs")[1][0][0] == 1
        assert store.query("SELECT count(*) FROM calls")[1][0][0] == 26
