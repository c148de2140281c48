"""What a command leaves behind and what it may reach, run as a user runs it (`python -m toolaudit` in a
process of its own, on real DuckDB files):

- a command that fails before writing leaves no database file (nor its WAL, snapshot or engine log), and a
  database that was there stays as it was; a writer that fails leaves no run `running`;
- a writer that finds the file held by another process is told what a writer can do (wait, or another --db),
  not the readers' snapshot advice; a reader still gets that advice;
- `sql` reaches nothing but the database (no COPY TO a file, no read_csv, no turning access back on) unless
  --allow-files;
- what commands write beside a database in the checkout is ignored by git.

SIGTERM and Ctrl-C are in tests/cli/test_sigterm.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import REPO, line, tool_call, write_jsonl

from toolaudit.cli import cli
from toolaudit.engines.logs import log_file_for
from toolaudit.store import Store
from toolaudit.store.snapshot import snapshot_path

GOOD = [line(session=f"s{k}", calls=[tool_call("close_ticket", {"ticket_id": k})]) for k in range(3)]


def toolaudit(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`toolaudit ARGS` in a process of its own, this checkout's code first on the path."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "toolaudit", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def compared(tmp_path: Path, name: str = "audit.duckdb") -> Path:
    """A database holding one compare run (in process: the setting, not the thing under test)."""
    log = write_jsonl(tmp_path / "good.jsonl", GOOD)
    db = tmp_path / name
    done = CliRunner().invoke(cli, ["compare", str(log), str(log), "--db", str(db)])
    assert done.exit_code == 0, done.output
    return db


def runs_in(db: Path) -> list[tuple]:
    with Store(db, read_only=True) as store:
        return store.query("SELECT run_id, kind, status FROM runs ORDER BY run_id")[1]


def test_a_command_that_fails_before_writing_leaves_no_database(tmp_path):
    other = write_jsonl(tmp_path / "other.jsonl", GOOD)
    before = sorted(p.name for p in tmp_path.iterdir())

    missing = toolaudit("compare", "missing.jsonl", "other.jsonl", "--db", "new.duckdb", cwd=tmp_path)
    assert missing.returncode == 2 and "missing.jsonl: cannot open trace file" in missing.stderr, missing.stderr

    paths = tmp_path / "paths.toml"
    paths.write_text('[paths.a]\nengine = "torch"\nmodel = \n')
    bad = toolaudit("replay", str(other), "--paths", str(paths), "--baseline", "a", "--candidate", "a", "--db",
                    "new.duckdb", cwd=tmp_path)
    assert bad.returncode == 1 and "paths.toml: not valid TOML" in bad.stderr, bad.stderr
    paths.write_text('[paths.a]\nengine = "nope"\n')
    unknown = toolaudit("replay", str(other), "--paths", str(paths), "--baseline", "a", "--candidate", "a",
                        "--db", "new.duckdb", cwd=tmp_path)
    assert unknown.returncode == 1 and "paths.a: engine must be one of" in unknown.stderr, unknown.stderr
    paths.unlink()

    # nothing at all was left: no database, WAL, snapshot or engine log
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    for leftover in ("new.duckdb", "new.duckdb.wal", snapshot_path("new.duckdb"), log_file_for("new.duckdb")):
        assert not (tmp_path / leftover).exists(), leftover

    # a database that was there keeps what it held when a command on it fails
    db = compared(tmp_path)
    held = runs_in(db)
    assert held == [(1, "compare", "complete")]
    again = toolaudit("compare", "missing.jsonl", "other.jsonl", "--db", str(db), cwd=tmp_path)
    assert again.returncode == 2 and "missing.jsonl" in again.stderr
    assert db.exists() and runs_in(db) == held


def test_a_writer_that_fails_leaves_no_run_running(tmp_path):
    """Whatever stops a writer between its statements (an error, or a signal where no library code catches
    it), closing the store marks the runs it made interrupted; a batch run waiting for its other side stays
    running, as the next writer leaves it (store/recovery.py)."""
    db = compared(tmp_path)
    with pytest.raises(RuntimeError, match="stopped"), Store(db) as store:
        replay = store.create_run("replay", None, "a", "b", "", "", {})
        batch = store.create_run("batch", None, "a", "b", "", "", {})
        raise RuntimeError("stopped")
    assert runs_in(db) == [(1, "compare", "complete"), (replay, "replay", "interrupted"), (batch, "batch", "running")]


@pytest.fixture
def holder(tmp_path):
    """Another process holding a database file open for writing until the test closes its stdin."""
    db = compared(tmp_path, "held.duckdb")
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import duckdb, sys
        con = duckdb.connect({str(db)!r})
        print("holding", flush=True)
        sys.stdin.read()
        con.close()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "holding"
        yield db, proc
    finally:
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0


def test_a_writer_that_finds_the_file_held_is_told_to_wait_or_use_another_db(holder, tmp_path):
    db, proc = holder
    writer = toolaudit("compare", "good.jsonl", "good.jsonl", "--db", str(db), cwd=tmp_path)
    assert writer.returncode == 1
    assert writer.stderr.strip() == (
        f"Error: {db}: database is locked by another writer (held by process {proc.pid}); only one process may "
        f"write a database at a time: wait for it to finish, or use another --db")

    reader = toolaudit("summary", "--db", str(db), cwd=tmp_path)  # readers are told of snapshots instead
    assert reader.returncode == 1
    assert f"(held by process {proc.pid}) and no snapshot of it for readers is published yet" in reader.stderr
    assert "use another --db" not in reader.stderr

    proc.stdin.close()
    assert proc.wait(timeout=60) == 0
    assert runs_in(db) == [(1, "compare", "complete")]  # the refused writer wrote nothing
    assert toolaudit("compare", "good.jsonl", "good.jsonl", "--db", str(db), cwd=tmp_path).returncode == 0


def test_sql_reaches_only_the_database_unless_allow_files(tmp_path, monkeypatch):
    other = compared(tmp_path, "other.duckdb")
    db = compared(tmp_path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "secret.csv").write_text("token\nsk-do-not-print\n")

    def sql(*args: str):
        return CliRunner().invoke(cli, ["sql", *args, "--db", str(db)])

    fine = sql("SELECT count(*) AS n FROM calls", "--json")
    assert fine.exit_code == 0 and '"n": 3' in fine.output, fine.output

    written = sql("COPY (SELECT 42 AS answer) TO 'out.csv'")
    assert written.exit_code == 1 and not (tmp_path / "out.csv").exists()
    assert "file system operations are disabled" in written.output and "--allow-files" in written.output
    for query in ("SELECT * FROM read_csv('secret.csv')", "SELECT * FROM read_text('secret.csv')",
                  "SELECT * FROM read_csv('/etc/passwd')", f"ATTACH '{other}' AS other",
                  # turning access back on, or unlocking the settings first, is refused too
                  "SET enable_external_access = true; SELECT * FROM read_csv('secret.csv')",
                  "RESET lock_configuration; SELECT * FROM read_csv('secret.csv')"):
        read = sql(query)
        assert read.exit_code == 1, (query, read.output)
        assert "sk-do-not-print" not in read.output and "root:" not in read.output
        assert "--allow-files" in read.output, (query, read.output)

    allowed = sql("COPY (SELECT 42 AS answer) TO 'out.csv'", "--allow-files")
    assert allowed.exit_code == 0, allowed.output
    assert (tmp_path / "out.csv").read_text().split() == ["answer", "42"]
    read = sql("SELECT token FROM read_csv('secret.csv')", "--allow-files", "--json")
    assert read.exit_code == 0 and "sk-do-not-print" in read.output, read.output


def test_what_commands_write_beside_a_database_is_ignored_by_git():
    """`make demo` writes toolaudit.duckdb and toolaudit.engines.log in the checkout; a replay or compare also
    its WAL, the readers' snapshot (and its temporary copy), and --collected its selections."""
    if shutil.which("git") is None or subprocess.run(["git", "rev-parse"], cwd=REPO, capture_output=True).returncode:
        pytest.skip("not a git checkout")
    from toolaudit.collect.select import selection_path

    db = "toolaudit.duckdb"
    snapshot = snapshot_path(db)
    written = [db, f"{db}.wal", str(log_file_for(db)), str(snapshot), f"{snapshot}.wal", f"{snapshot}.tmp-4127",
               f"{snapshot}.tmp-4127.wal", str(selection_path(db, "replay")), "audit.engines.log"]
    checked = subprocess.run(["git", "check-ignore", "--verbose", "--non-matching", *written], cwd=REPO,
                             capture_output=True, text=True)
    not_ignored = [row.split("\t")[-1] for row in checked.stdout.splitlines() if row.startswith("::")]
    assert not_ignored == [] and len(checked.stdout.splitlines()) == len(written), checked.stdout
    assert str(log_file_for(db)) == "toolaudit.engines.log"  # the name `make demo` leaves
