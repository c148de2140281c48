"""Engines' own output (vLLM's and transformers' logs, Python warnings, progress bars, what worker processes and
C++ code print) goes to a log file instead of the user's terminal, where it buried toolaudit's progress and
results (a replay of 6 calls through an hf and a vLLM path printed 94 lines, 73 of them the engines' own).

`EngineLogs.captured()` is held around every engine call (create, load, generate, fingerprint, close): it
points file descriptors 1 and 2 at the log file, so output from C code and from processes spawned meanwhile
(vLLM's engine core and workers, which keep writing there for their whole life) lands in the file, and
swaps `sys.stdout` / `sys.stderr`, so Python-level writes land there too. Between engine calls the terminal
is the user's again (progress lines). `summary()` names the file with its counts; lines that matter to the
user are repeated once in toolaudit's words (`LogNote`, declared by each engine's `EngineSpec`).

Progress bars (transformers' "Loading weights", tqdm's, Hugging Face Hub's) are off while output goes to a file
(`quiet_progress_bars`): drawn for a terminal, in the file a bar is one long line of carriage returns, and an engine
loaded outside `captured()` (a probe's) would draw it on the user's terminal. `--verbose` keeps them.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

_WARNING = re.compile(r"\bWARN(?:ING)?\b|Warning:|\w+Warning\b")
_ERROR = re.compile(r"\bERROR\b|\bTraceback \(most recent call last\)|\w+Error: ")
_KEPT: list[io.TextIOWrapper] = []  # streams handed to engines: never closed, never collected


@dataclass(frozen=True)
class LogNote:
    """A line of an engine's own log worth telling the user, once, in toolaudit's words."""

    pattern: str  # a regular expression searched in each line
    says: str


class EngineLogs:
    """Where engines' output goes during one command: `file` (appended to), or nowhere special when `file` is
    None (`--verbose`, and library use: the library leaves a caller's terminal alone unless asked)."""

    def __init__(self, file: Path | str | None):
        self.file = Path(file) if file is not None else None
        self._start: int | None = None  # the file's size before this command wrote to it
        self._text: io.TextIOWrapper | None = None
        self._depth = 0
        if self.file is not None:  # engines' output is not for the terminal in this command: nor are their bars
            quiet_progress_bars()

    @contextlib.contextmanager
    def captured(self) -> Iterator[None]:
        """Engine output inside this block goes to the file (nested blocks reuse the outer one)."""
        if self.file is None or self._depth:
            yield
            return
        text = self._stream()
        self._depth += 1
        before = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
        _flush(before)
        saved: list[tuple[int, int]] = []
        try:
            for target in (1, 2):
                try:
                    saved.append((target, os.dup(target)))
                except OSError:  # no such descriptor (a daemon): nothing to redirect
                    continue
                os.dup2(text.fileno(), target)
            with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
                try:
                    yield
                finally:
                    _flush((text, *before))  # what handlers bound to the real streams buffered belongs in the file
        finally:
            for target, copy in saved:
                os.dup2(copy, target)
                os.close(copy)
            self._depth -= 1

    def _stream(self) -> io.TextIOWrapper:
        """The log file as a text stream, opened once and never closed: a logging handler an engine creates
        while captured (vLLM configures its own on import) binds to it and keeps writing to the file."""
        if self._text is None:
            self._open()
            fd = os.open(self.file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._text = io.TextIOWrapper(io.FileIO(fd, "w"), encoding="utf-8", errors="replace",
                                          line_buffering=True)
            _KEPT.append(self._text)
        return self._text

    def _open(self) -> None:
        """On first use in this command: a header line, so appended runs can be told apart."""
        if self._start is not None:
            return
        self.file.parent.mkdir(parents=True, exist_ok=True)
        self._start = self.file.stat().st_size if self.file.exists() else 0
        with self.file.open("a", encoding="utf-8") as f:
            command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:300]
            f.write(f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} pid {os.getpid()}: {command} ====\n")

    def lines(self) -> list[str]:
        """What engines wrote during this command (after its header line)."""
        if self.file is None or self._start is None or not self.file.exists():
            return []
        with self.file.open("rb") as f:
            f.seek(self._start)
            text = f.read().decode("utf-8", "replace")
        return text.split("\n")[1:-1] if text.endswith("\n") else text.split("\n")[1:]  # "\r" (progress) stays in

    def summary(self, notes: Iterable[LogNote] = ()) -> list[str]:
        """Lines for the user: each note whose pattern matched (once), then where the log is with its counts.
        A command whose engines wrote nothing leaves no file (and says nothing)."""
        lines = self.lines()
        if not lines:
            self._drop_header()
            return []
        said = [f"note: {n.says}" for n in dict.fromkeys(notes) if any(re.search(n.pattern, line) for line in lines)]
        errors = sum(1 for line in lines if _ERROR.search(line))
        warnings = sum(1 for line in lines if _WARNING.search(line) and not _ERROR.search(line))
        counts = ", ".join(f"{n} {word}{'s' if n > 1 else ''}" for n, word in ((warnings, "warning"), (errors, "error"))
                           if n)
        size = f"{len(lines)} line{'s' if len(lines) > 1 else ''}"
        return [*said, f"engine logs: {self.file} ({size}{', ' + counts if counts else ''})"]

    def _drop_header(self) -> None:
        if self.file is None or self._start is None or not self.file.exists():
            return
        if self._start == 0:
            self.file.unlink()
        else:
            os.truncate(self.file, self._start)


# Read by huggingface_hub (and so transformers) and tqdm when imported: modules imported later and the processes
# started later (vLLM's engine core and workers) draw no bar.
_NO_PROGRESS_BARS = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1"}


def quiet_progress_bars() -> None:
    """Turn engines' progress bars off for the rest of this process and the processes it starts: the environment
    for what is imported or started later, and the switches of transformers and huggingface_hub where they are
    imported already (each reads the environment once, on import)."""
    os.environ.update(_NO_PROGRESS_BARS)
    hub, transformers_logging = sys.modules.get("huggingface_hub.utils"), sys.modules.get("transformers.utils.logging")
    # a version without the switch (AttributeError): the bar goes to the file, as before
    if hub is not None:
        with contextlib.suppress(Exception):
            hub.disable_progress_bars()
    if transformers_logging is not None:
        with contextlib.suppress(Exception):
            transformers_logging.disable_progress_bar()


def log_file_for(db: str | Path) -> Path:
    """Engine logs live beside the database they fed: `audit.duckdb` -> `audit.engines.log`."""
    path = Path(db)
    return path.with_name(f"{path.stem}.engines.log")


def _flush(streams: Iterable) -> None:
    for stream in streams:
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.flush()
