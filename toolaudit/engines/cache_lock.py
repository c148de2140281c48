"""One writer per model cache entry across processes (pytest workers, parallel replays, a user's two shells).

Why: the conversions and drafts are written to a temporary directory and renamed into place, so a loser of the
race never corrupts the cache, but each loser still spent ~20 s of CPU converting the same GGUF, on a 2-core
machine beside the winner. Holding an exclusive `flock` on a sidecar file while checking and writing makes the
second process wait and then reuse what the first wrote. The lock is advisory and released by the kernel when
its holder dies, so a killed conversion never blocks the next one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator
from pathlib import Path


@contextlib.contextmanager
def writing(target: Path) -> Iterator[None]:
    """Hold the lock of cache entry `target` (the file `.<name>.lock` beside it) for the block."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target.parent / f".{target.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def once(target: Path, written: Callable[[], bool], write: Callable[[], None]) -> None:
    """`write()` unless `written()`, checked again under the lock: a process that waited reuses what the
    holder wrote instead of writing it a second time."""
    if written():
        return
    with writing(target):
        if not written():
            write()
