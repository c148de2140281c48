"""Ctrl-C and SIGTERM end a writing command (`replay`, `demo`, `compare`) the same way.

Cron, systemd and Kubernetes stop a process with SIGTERM, whose default action ends it on the spot, as a
kill -9 does: safe (docs/reliability.md), but silent, and the run stays `running` until the next writer
settles it. Here SIGTERM raises `Terminated`, a `KeyboardInterrupt`, where the main thread is, so every path
that settles a run on Ctrl-C (a transaction rolled back, the run marked `interrupted`) settles it on SIGTERM;
then one line says what became of the run and the command that finishes it, and the exit status is 128 + the
signal's number, as a shell reports a process the signal ended: 130 for Ctrl-C, 143 for SIGTERM.

DuckDB turns an exception raised by a signal handler during a query into its own error (`RuntimeError: Query
interrupted`), and a broad `except` on the way may swallow one; so the signal is also recorded, and whatever
ends the command after it (an error, or even success) is reported as the interruption. A second signal of the
same kind stops the command at once (Ctrl-C as Python does by default, SIGTERM as the default action): what is
committed stays whole, as after kill -9.
"""

from __future__ import annotations

import functools
import shlex
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from toolaudit import StoreError, ToolauditError

if TYPE_CHECKING:
    from toolaudit.store import Store

ARGV = "toolaudit.argv"  # ctx.meta key: the command line the root group parsed
_SECOND = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised as Ctrl-C is: code that settles a run on KeyboardInterrupt settles it on SIGTERM too."""


class Interrupted(click.ClickException):
    """The command was stopped by a signal: the message says what became of its run; exit status 128 + signal."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum


@dataclass
class _Watch:
    """One command's interruption: the first signal received, and the writer's store (its file and run)."""

    signum: int | None = None
    store: Store | None = None


_current: _Watch | None = None


def watch_store(store: Store) -> None:
    """Name the store this command writes, so that an interruption can say what became of its run."""
    if _current is not None:
        _current.store = store


def interruptible(func: Callable) -> Callable:
    """Run a writing command with SIGINT and SIGTERM handled as the module docstring says. Put it under
    `friendly_errors`, so it sees the library's errors before they become messages."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        global _current
        watch, outer = _Watch(), _current
        _current = watch
        try:
            with _handlers(watch):
                try:
                    result = func(*args, **kwargs)
                except BaseException as exc:
                    signum = watch.signum or (signal.SIGINT if isinstance(exc, KeyboardInterrupt) else None)
                    if signum is None or isinstance(exc, Interrupted):
                        raise
                    raise Interrupted(_advice(watch, signum), signum) from None
                if watch.signum is not None:  # swallowed on the way: the command ran on to its end
                    raise Interrupted(_advice(watch, watch.signum), watch.signum)
                return result
        finally:
            _current = outer

    return wrapper


@contextmanager
def _handlers(watch: _Watch) -> Iterator[None]:
    """SIGINT and SIGTERM raise in the main thread (elsewhere signals cannot be handled: left as they are)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum: int, frame: object) -> None:
        watch.signum = watch.signum or signum
        signal.signal(signum, _SECOND[signum])  # a second one stops the command at once
        raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()

    previous = {sig: signal.signal(sig, handle) for sig in _SECOND}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _advice(watch: _Watch, signum: int) -> str:
    """What became of the run, read back from the file once the writer has closed it, and what finishes it."""
    head = f"interrupted ({signal.Signals(signum).name})"
    again = _command_line()
    rerun = f"run it again: {again}" if again else "run the same command again"
    store = watch.store
    if store is None or store.active_run is None:
        return f"{head} before its run started; nothing was stored; {rerun}"
    db, run_id = shlex.quote(store.path), store.active_run
    try:
        run, members = _run_of(store.path, run_id)
    except ToolauditError:
        return f"{head}; see its runs: toolaudit runs --db {db}"
    if run is None:
        return f"{head} before its run started; nothing was stored; {rerun}"
    if run["status"] == "complete":
        return f"{head} after run {run_id} completed; nothing is lost: toolaudit summary --run {run_id} --db {db}"
    if run["kind"] == "replay" or (run["kind"] == "matrix" and members and all(k == "replay" for k in members)):
        return f"{head}; finish it with: toolaudit replay --resume {run_id} --db {db}"
    return (f"{head}; {run['kind']} run {run_id} is rolled back when the database is next written "
            f"(a comparison has nothing worth keeping); {rerun}")


def _run_of(path: str, run_id: int) -> tuple[dict | None, list[str]]:
    """The run row (None when it was never written) and its matrix members' kinds, read-only."""
    from toolaudit.store import Store

    if not Path(path).exists():  # created by this command and removed: it wrote no run
        return None, []
    with Store(path, read_only=True) as store:
        try:
            run = store.run_row(run_id)
        except StoreError:  # no such run: stopped before its row was written
            return None, []
        return run, [m["kind"] for m in store.matrix_members(run_id)]


def _command_line() -> str | None:
    """This command as typed, from the root group's parse (None when a command was invoked on its own)."""
    ctx = click.get_current_context(silent=True)
    argv = ctx.find_root().meta.get(ARGV) if ctx is not None else None
    return shlex.join(["toolaudit", *argv]) if argv else None
