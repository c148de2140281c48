"""Collected requests on disk: one OTLP/JSON line per export request, in one file per hour (UTC, by receive
time): `DIR/traces-YYYYMMDDTHH.jsonl`, the shape a collector's file exporter writes, so every reader takes it.

Durable before acknowledged: a line is written with one `write` of the whole line, then flushed and fsynced
(and a new file's directory entry fsynced), before the receiver answers 200, so a kill -9 loses nothing that was
acknowledged. A kill during the write can leave a torn last line: `CollectedFiles` truncates it when it opens
the folder again, and readers (`select.py`) skip a last line that has no newline. A lock file keeps a second
receiver out of the same folder.
"""

from __future__ import annotations

import fcntl
import os
import re
import threading
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from toolaudit import ConfigError

HOUR_FORMAT = "%Y%m%dT%H"
FILE_RE = re.compile(r"traces-(\d{8}T\d{2})\.jsonl")
LOCK_NAME = ".collect.lock"


def file_name(when: datetime) -> str:
    return f"traces-{when.astimezone(timezone.utc).strftime(HOUR_FORMAT)}.jsonl"


def file_hour(path: Path) -> datetime | None:
    """The UTC hour a collected file holds requests of (None: not a collected file)."""
    match = FILE_RE.fullmatch(path.name)
    return datetime.strptime(match.group(1), HOUR_FORMAT).replace(tzinfo=timezone.utc) if match else None


def collected_files(folder: Path) -> list[Path]:
    """The folder's collected files, oldest first."""
    return sorted(p for p in folder.iterdir() if file_hour(p) is not None) if folder.is_dir() else []


def complete_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of every complete line: a last line without its newline is a torn write, skipped."""
    with path.open("rb") as handle:
        for number, line in enumerate(handle, 1):
            if line.endswith(b"\n"):
                yield number, line


class CollectedFiles:
    """The receiver's folder: appends lines durably, one file per hour. Thread-safe (one writer at a time)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(self.folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ConfigError(f"{self.folder}: cannot collect here: {exc.strerror or exc}") from None
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._lock_fd)
            raise ConfigError(f"{self.folder}: another toolaudit collect is writing here") from None
        self._mutex = threading.Lock()
        self._fd: int | None = None
        self._name = ""
        self.truncated = [p.name for p in collected_files(self.folder) if _truncate_torn(p)]

    def append(self, line: bytes, now: datetime | None = None) -> Path:
        """Write `line` (one JSON document, no newline) to the current hour's file and fsync it."""
        name = file_name(now or datetime.now(timezone.utc))
        with self._mutex:
            if name != self._name:
                self._open(name)
            data = line + b"\n"
            size = os.lseek(self._fd, 0, os.SEEK_END)
            try:
                written = os.write(self._fd, data)
                if written != len(data):
                    raise OSError(f"short write ({written} of {len(data)} bytes)")
                os.fsync(self._fd)
            except OSError:
                os.ftruncate(self._fd, size)  # no torn line left behind for the next request to follow
                raise
            return self.folder / name

    def _open(self, name: str) -> None:
        if self._fd is not None:
            os.close(self._fd)
        path = self.folder / name
        created = not path.exists()
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._name = name
        if created:  # the new file's entry in the folder must survive a crash too
            folder_fd = os.open(self.folder, os.O_RDONLY)
            try:
                os.fsync(folder_fd)
            finally:
                os.close(folder_fd)

    def close(self) -> None:
        with self._mutex:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            os.close(self._lock_fd)


def _truncate_torn(path: Path) -> bool:
    """Cut a torn last line (a write killed midway) off `path`; True if there was one."""
    size = path.stat().st_size
    if size == 0:
        return False
    with path.open("r+b") as handle:
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return False
        keep = 0
        block = 1 << 16
        end = size
        while end > 0 and not keep:
            start = max(0, end - block)
            handle.seek(start)
            chunk = handle.read(end - start)
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                keep = start + cut + 1
            end = start
        handle.truncate(keep)
        handle.flush()
        os.fsync(handle.fileno())
    return True
