"""Readers answer while a writer holds the database: they open the writer's snapshot and say how current it is.

The writer is a separate process (DuckDB locks the file per process) holding a `Store` and committing chunks of
calls, each chunk released by a line this test writes on its stdin and acknowledged on its stdout: timing keyed
to progress, no sleeps."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import line, tool_call, write_jsonl

from toolaudit.cli import cli
from toolaudit.store import Store
from toolaudit.store.db import DatabaseLocked
from toolaudit.store.snapshot import snapshot_path

ROOT = Path(__file__).resolve().parents[2]
CHUNK, CHUNKS = 4, 3
WRITER = textwrap.dedent(f"""
    import sys
    from toolaudit.store import RowBuffer, Store

    db = sys.argv[1]

    def released(name):  # blocks until the test writes the step's name on stdin
        got = sys.stdin.readline().strip()
        assert got == name, (got, name)

    store = Store(db)
    snapshots = store.publish_snapshots("replay", min_interval_s=0, max_share=1.0)
    run_id = store.create_run("replay", "live", "target", "spec-ngram", "t", "c", {{}})
    snapshots.done, snapshots.total = 0, {CHUNK * CHUNKS}
    snapshots.publish()
    print("started", run_id, flush=True)
    for k in range({CHUNKS}):
        released(f"chunk-{{k}}")
        rows = RowBuffer()
        for i in range({CHUNK}):  # the first call of each chunk drifted
            rows.add("calls", run_id=run_id, session_id=f"s{{k}}", call_index=i, customer="acme",
                     tool_name="close_ticket", match_status="matched",
                     drift_kind="arguments_changed" if i == 0 else "identical", drifted=i == 0,
                     exact_text_match=i != 0, baseline_valid=True, candidate_valid=True, arg_diff_count=int(i == 0))
        store.write_rows(rows)
        snapshots.done = (k + 1) * {CHUNK}
        snapshots.publish()
        print("chunk", k, flush=True)
    released("finish")
    store.finish_run(run_id, {{}})
    store.close()
    print("closed", flush=True)
""")


class Writer:
    def __init__(self, db: Path):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen([sys.executable, "-c", WRITER, str(db)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        words = self.proc.stdout.readline().split()
        assert words[0] == "started", words
        self.run_id = int(words[1])

    def release(self, name: str) -> str:
        self.proc.stdin.write(name + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def writer(tmp_path):
    db = tmp_path / "audit.duckdb"
    Store(db).close()
    w = Writer(db)
    w.db = db
    yield w
    w.stop()


def cli_run(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_readers_answer_during_a_run_then_read_the_main_file(writer, tmp_path):
    db = str(writer.db)
    note = f"being written by process {writer.proc.pid} (replay run {writer.run_id}): figures as of "
    first = cli_run("summary", "--db", db, "--json")
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout)["calls"] == 0 and note in first.stderr and "0 of 12 calls" in first.stderr

    assert writer.release("chunk-0") == "chunk 0"
    summary = cli_run("summary", "--db", db, "--json")
    assert summary.exit_code == 0, summary.output
    figures = json.loads(summary.stdout)
    assert (figures["run_id"], figures["status"], figures["calls"], figures["drifted_calls"]) == (
        writer.run_id, "running", CHUNK, 1)
    assert note in summary.stderr and "UTC, 4 of 12 calls" in summary.stderr

    sql = cli_run("sql", "SELECT count(*) AS n FROM calls", "--db", db, "--json")
    assert sql.exit_code == 0 and json.loads(sql.stdout) == [{"n": CHUNK}] and note in sql.stderr
    within = cli_run("check", "--db", db, "--max-call-drift", "50%", "--rule", "point")
    assert within.exit_code == 0 and note in within.stderr, within.output
    broken = cli_run("check", "--db", db, "--max-call-drift", "10%", "--rule", "point")
    assert broken.exit_code == 1 and note in broken.stderr, broken.output  # the gate's own verdict
    report = cli_run("report", "--db", db, "--customer", "acme", "--write", "json", "-o", str(tmp_path / "r"))
    assert report.exit_code == 0 and note in report.stderr, report.output
    assert json.loads(Path(report.stdout.strip()).read_text())["customer"] == "acme"
    runs = cli_run("runs", "--db", db)
    assert runs.exit_code == 0 and note in runs.stderr

    # writer against writer stays a clear error, naming the run that holds the file (from its snapshot), and
    # leaves the first writer's snapshot alone
    held = f"locked by another writer (held by process {writer.proc.pid}: toolaudit replay run {writer.run_id})"
    with pytest.raises(DatabaseLocked, match=re.escape(held)):
        Store(db)
    good = write_jsonl(tmp_path / "good.jsonl", [line(calls=[tool_call("close_ticket", {"ticket_id": 1})])])
    second = cli_run("compare", str(good), str(good), "--db", db)
    assert second.exit_code == 1 and held in second.output and "wait for it to finish, or use another --db" in (
        second.output) and "snapshot" not in second.output
    assert snapshot_path(db).exists()

    assert [writer.release(f"chunk-{k}") for k in (1, 2)] == ["chunk 1", "chunk 2"]
    later = cli_run("sql", "SELECT count(*) AS n FROM calls", "--db", db, "--json")
    assert json.loads(later.stdout) == [{"n": CHUNK * CHUNKS}] and "12 of 12 calls" in later.stderr

    assert writer.release("finish") == "closed"
    assert writer.proc.wait() == 0
    assert not snapshot_path(db).exists()  # removed once the main file was free
    after = cli_run("summary", "--db", db, "--json")
    assert after.exit_code == 0 and after.stderr == ""
    assert (json.loads(after.stdout)["status"], json.loads(after.stdout)["calls"]) == ("complete", CHUNK * CHUNKS)


def test_a_killed_writers_snapshot_is_never_read(writer, tmp_path):
    db = str(writer.db)
    assert writer.release("chunk-0") == "chunk 0"
    writer.stop()  # kill -9: the snapshot stays behind, the run stays `running`
    assert snapshot_path(db).exists()
    fresh = cli_run("sql", "SELECT count(*) AS n FROM calls", "--db", db, "--json")
    assert fresh.exit_code == 0 and fresh.stderr == "" and json.loads(fresh.stdout) == [{"n": CHUNK}]

    # another process holds the file now and publishes nothing: the dead writer's snapshot is not its data
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import duckdb, sys
        con = duckdb.connect({db!r})
        print("locked", flush=True)
        sys.stdin.read()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        stale = cli_run("summary", "--db", db)
        assert stale.exit_code == 1
        assert f"locked by another writer (held by process {holder.pid}) and no snapshot" in stale.output
    finally:
        holder.kill()
        holder.wait()


def test_snapshots_are_throttled(tmp_path):
    with Store(tmp_path / "audit.duckdb") as store:
        snapshots = store.publish_snapshots("compare", on_commit=True, min_interval_s=3600)
        first = snapshots.last
        assert snapshot_path(store.path).exists() and first > float("-inf")  # a small database: at once
        run_id = store.create_run("compare", None, "b", "c", "b", "c", {})
        assert snapshots.last > first  # a new run: at once, the throttle aside, so readers learn which it is
        first = snapshots.last
        store.set_status(run_id, "running")
        with store.transaction():
            pass
        assert snapshots.last == first  # within min_interval_s: no new copy
        snapshots.min_interval_s, snapshots.max_share = 0, 1e-9
        snapshots.bytes_per_s = 1.0  # as if copying were slow: the share forbids it
        snapshots.update()
        assert snapshots.last == first
        snapshots.max_share = 1.0
        snapshots.bytes_per_s = 1e12
        with store.transaction():  # commits publish when the throttle allows
            pass
        assert snapshots.last > first
    assert not snapshot_path(tmp_path / "audit.duckdb").exists()


def test_replay_progress_reaches_the_snapshot_note(tmp_path):
    """`replay`'s progress bar hands each chunk's count (after its commit) to the snapshot readers open."""
    from toolaudit.cli.replay import _LazyBar
    from toolaudit.store.snapshot import open_snapshot

    db = tmp_path / "audit.duckdb"
    with Store(db) as store:
        bar = _LazyBar(store.publish_snapshots("replay", min_interval_s=0, max_share=1.0))
        bar.start(10)
        bar.update(4)
        bar.close()
        con, note = open_snapshot(str(db), os.getpid(), Store._connect_snapshot)
        con.close()
        assert (note.pid, note.command, note.done, note.total) == (os.getpid(), "replay", 4, 10)
        assert note.line(str(db)).endswith("UTC, 4 of 10 calls")
