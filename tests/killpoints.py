"""Kill a toolaudit command with SIGKILL (or stop it with SIGTERM, SIGINT) at a chosen point of its progress, from
outside.

A point is "just before the N-th SQL statement the command runs on a writable DuckDB connection": the child's
`duckdb.connect` is wrapped so that a read-write connection counts its statements (execute, executemany, sql,
query, append). That covers points inside a transaction, between two, in bookkeeping, in snapshot publishing,
and after the last commit (the summary's queries), without the code under test knowing. At the N-th statement
the child tells the parent over a pipe and blocks on the pipe; the parent SIGKILLs it. With another signal
(`Launcher.run(..., signal=SIGTERM)`) the child goes on from there (the signal's handler raises out of the
blocked read, before the statement runs) and its later statements run unhindered, so the test sees how the
command ends. No sleeps: only deadlines, so a hang fails the test instead of stalling it.

Commands run in children of a forkserver that imported toolaudit, DuckDB and torch once (`preload`), so each
run starts in milliseconds instead of paying the imports (a kill suite runs ~200 commands).
"""

from __future__ import annotations

import gc
import itertools
import multiprocessing
import os
import random
import signal
import sys
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path

_SIGKILL = signal.SIGKILL  # `Launcher.run`'s `signal` argument hides the module
DEADLINE_S = 120.0  # one command, killed or not: a safety net only
PRELOAD = ["toolaudit.cli", "toolaudit.cli.compare", "toolaudit.cli.replay", "toolaudit.cli.merge",
           "toolaudit.cli.batch", "toolaudit.compare.logs", "toolaudit.replay.replayer", "toolaudit.replay.batch",
           "toolaudit.store.combine", "toolaudit.analysis.figures", "duckdb", "pyarrow", "killpoints"]
_COUNTED = ("execute", "executemany", "sql", "query", "append")


@dataclass
class Outcome:
    """What became of one command: killed before statement `statements`, or ran to the end (`statements`
    counted, exit code, its stdout and stderr)."""

    killed: bool
    statements: int
    exit_code: int | None = None
    output: str = ""


class _Counter:
    """Counts statements across the child's writable connections; the `kill_at`-th one (and any after it, on
    another thread) reports to the parent and blocks until the parent's SIGKILL. With `once`, only the
    `kill_at`-th blocks: the parent's signal ends the wait, and the command goes on to its end."""

    def __init__(self, kill_at: int | None, conn, once: bool = False):
        self.kill_at, self.conn, self.n, self.once = kill_at, conn, 0, once
        self.lock = threading.Lock()

    def tick(self) -> None:
        with self.lock:
            self.n += 1
            reached = self.kill_at is not None and self.n >= self.kill_at
            if reached and self.n == self.kill_at:
                if self.once:  # before telling the parent: its signal may come before the read below
                    self.kill_at = None
                self.conn.send(("at", self.n))
        if reached:
            self.conn.recv()  # never answered: the parent's signal ends this


class _Counted:
    """A DuckDB connection whose statements tick the counter; everything else is the connection's."""

    def __init__(self, con, counter: _Counter):
        object.__setattr__(self, "_con", con)
        object.__setattr__(self, "_counter", counter)

    def __getattr__(self, name: str):
        attr = getattr(self._con, name)
        if name not in _COUNTED:
            return attr

        def counted(*args, **kwargs):
            self._counter.tick()
            result = attr(*args, **kwargs)
            return self if result is self._con else result  # execute() returns the connection: keep counting

        return counted

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._con.close()


def path_major() -> None:
    """Replays run path-major (one path over every call, then the other, the first side's results staged in
    the database) as they do with vLLM, whose engines cannot be held together, here with the torch engine."""
    from toolaudit.replay.engine_pool import EnginePool

    EnginePool.holds_together = lambda self, paths: False


def echo_engine() -> None:
    """The echo engine of tests/plugins/toolaudit-echo-engine (answers from the request alone: no model, a
    replay in milliseconds), registered as if its distribution were installed."""
    from dataclasses import replace

    sys.path.insert(0, str(Path(__file__).parent / "plugins" / "toolaudit-echo-engine"))
    from toolaudit_echo_engine import ENGINE

    from toolaudit.engines.registry import ENGINES

    ENGINES.specs["echo"] = replace(ENGINE, source="tests/plugins/toolaudit-echo-engine")


SETUPS = {"path-major": path_major, "echo-engine": echo_engine}  # run in the child before the command


def _start_forkserver(preload: list[str]) -> None:
    """Start the process's fork server with `preload`, and this folder on its PYTHONPATH. Python 3.11's fork
    server takes the parent's `sys.path` but never applies it (`forkserver.main` ignores `sys_path`), so the tests'
    own preload modules (`killpoints`, `killwarm`) failed to import there, silently, and every child filled the
    caches again (the trace formats' entry points, the tiny model: ~1 s a command). The fork server is one per
    process: one another module's launcher started with another preload is stopped first."""
    from multiprocessing import forkserver

    server = forkserver._forkserver
    if server._forkserver_pid is not None and server._preload_modules != preload:
        server._stop()
    server.set_forkserver_preload(preload)
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent), before]))
    try:
        forkserver.ensure_running()
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before


def _child(argv: list[str], kill_at: int | None, conn, log: str, setup: str | None, once: bool) -> None:
    # The fork server's objects (torch, transformers, toolaudit: ~390k) are out of the child's garbage
    # collections: a full collection would walk and write every one of them, copying the server's memory page by
    # page into the child (tests/store/test_kill.py alone on one core: 54 s with, 59 s without).
    gc.freeze()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    import duckdb

    counter = _Counter(kill_at, conn, once)
    real_connect = duckdb.connect

    def connect(*args, **kwargs):
        con = real_connect(*args, **kwargs)
        return con if kwargs.get("read_only") else _Counted(con, counter)

    duckdb.connect = connect
    if setup is not None:
        SETUPS[setup]()
    from toolaudit.cli import cli

    code = 0
    try:
        cli.main(args=argv, prog_name="toolaudit", standalone_mode=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    conn.send(("done", counter.n, code))
    sys.exit(code)  # the process's own exit status, as the command's would be


class Launcher:
    """Runs toolaudit commands in forkserver children, killing them at a statement when asked."""

    def __init__(self, logs: Path, preload: list[str] = PRELOAD):
        self.ctx = multiprocessing.get_context("forkserver")
        self.logs = logs
        _start_forkserver(preload)
        self.runs = itertools.count(1)  # names each run's log; runs may be started from several threads

    def run(self, argv: list[str], kill_at: int | None = None, setup: str | None = None,
            signal: int = signal.SIGKILL) -> Outcome:
        """Run `toolaudit ARGV`; with `kill_at`, send `signal` just before its `kill_at`-th statement (SIGKILL:
        killed there; another signal: the command handles it and ends as it will, `Outcome.killed` false);
        `setup` names a function of SETUPS to run in the child first."""
        log = self.logs / f"run{next(self.runs)}.log"
        here, there = self.ctx.Pipe()
        once = signal != _SIGKILL
        child = self.ctx.Process(target=_child, args=(argv, kill_at, there, str(log), setup, once), daemon=True)
        child.start()
        there.close()
        try:
            if not here.poll(DEADLINE_S):
                raise AssertionError(f"toolaudit {' '.join(argv)}: no answer within {DEADLINE_S:g} s")
            try:
                message = here.recv()
            except EOFError:
                child.join(DEADLINE_S)
                raise AssertionError(f"toolaudit {' '.join(argv)} died (exit {child.exitcode}):\n"
                                     f"{log.read_text() if log.exists() else ''}") from None
            if message[0] == "at" and not once:
                os.kill(child.pid, _SIGKILL)
                child.join(DEADLINE_S)
                assert child.exitcode == -_SIGKILL, child.exitcode
                return Outcome(True, message[1], None, log.read_text())
            if message[0] == "at":
                os.kill(child.pid, signal)
                if not here.poll(DEADLINE_S):
                    raise AssertionError(f"toolaudit {' '.join(argv)}: did not end within {DEADLINE_S:g} s of "
                                         f"signal {signal}")
                message = here.recv()
            child.join(DEADLINE_S)
            assert child.exitcode == message[2], (child.exitcode, message)
            return Outcome(False, message[1], message[2], log.read_text())
        finally:
            if child.is_alive():
                child.kill()
                child.join(DEADLINE_S)
            here.close()


def points(seed: int, total: int, n: int = 12) -> list[int]:
    """`n` seeded kill points in 1..total, one drawn from each of `n` equal stretches of it (every point when there
    are fewer). Stratified rather than `n` draws from the whole, which can bunch up: every part of the command's
    work (start, each chunk, the commit, the end) gets a kill with fewer points."""
    if total <= n:
        return list(range(1, total + 1))
    rng = random.Random(seed)
    edges = [1 + total * i // n for i in range(n + 1)]  # stretch i: edges[i] .. edges[i + 1] - 1, never empty
    return [rng.randrange(edges[i], edges[i + 1]) for i in range(n)]
