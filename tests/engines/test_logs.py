"""Engines' own output goes to the log file, not the user's terminal: log records (through a handler an engine
configures while captured, as vLLM does on import, through one bound to the real stdout before, and through
logging's last resort), Python warnings, prints, C-level writes to file descriptor 2 and child processes.

Run in a child process on its real stdout/stderr: pytest's own log and warning capture would hide what a user
of the command line sees."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from helpers import REPO

NOISE = textwrap.dedent("""
    import logging, os, subprocess, sys, warnings
    from toolaudit.engines.logs import EngineLogs, LogNote

    early = logging.getLogger("engine-early")  # a handler bound to the real stdout before any capture
    early.propagate = False
    early.addHandler(logging.StreamHandler(sys.stdout))

    def noise(tag):
        own = logging.getLogger("engine-own-" + tag)  # configured while captured, as vLLM's on import
        own.propagate = False
        own.addHandler(logging.StreamHandler(sys.stdout))
        own.warning("%s: WARNING from the engine's own handler", tag)
        early.warning("%s: WARNING from a handler bound before", tag)
        logging.getLogger("engine-lib").warning("%s: a record for logging's last resort", tag)
        warnings.warn(tag + ": a FutureWarning", FutureWarning)
        print(tag + ": printed")
        os.write(2, (tag + ": written to fd 2\\n").encode())
        subprocess.run([sys.executable, "-c", f"import sys; print('{tag}: child process', file=sys.stderr)"])
        return own

    logs = EngineLogs(sys.argv[1] if len(sys.argv) > 1 else None)
    print("toolaudit: before", file=sys.stderr, flush=True)
    with logs.captured():
        own = noise("load")
    print("toolaudit: between", file=sys.stderr, flush=True)
    with logs.captured():
        own.warning("later: the engine's handler still writes to the file")
    for line in logs.summary([LogNote("child process", "a child spoke"), LogNote("never said", "unused")]):
        print(line, file=sys.stderr)
""")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", NOISE, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=True)


def test_engine_output_reaches_the_log_file_and_not_the_terminal(tmp_path):
    log = tmp_path / "audit.engines.log"
    done = run(str(log))
    assert done.stdout == ""
    assert done.stderr.splitlines() == ["toolaudit: before", "toolaudit: between", "note: a child spoke",
                                        f"engine logs: {log} (8 lines, 3 warnings)"]
    text = log.read_text()
    for line in ("load: WARNING from the engine's own handler", "load: WARNING from a handler bound before",
                 "load: a record for logging's last resort", "FutureWarning: load: a FutureWarning",
                 "load: printed", "load: written to fd 2", "load: child process",
                 "later: the engine's handler still writes to the file"):
        assert line in text, line
    assert text.startswith("==== ") and text.splitlines()[0].endswith(f"{log} ====")


def test_verbose_leaves_engine_output_on_the_terminal():
    done = run()
    assert "load: printed" in done.stdout and "load: WARNING from the engine's own handler" in done.stdout
    assert "load: written to fd 2" in done.stderr and "load: child process" in done.stderr
    assert "engine logs" not in done.stderr


def test_a_command_whose_engines_said_nothing_leaves_no_file(tmp_path):
    from toolaudit.engines.logs import EngineLogs

    quiet = EngineLogs(tmp_path / "idle.log")
    with quiet.captured():
        pass
    assert quiet.summary() == [] and not (tmp_path / "idle.log").exists()
