"""The model cache's writer lock: exclusive across processes, released when the block ends or its holder dies."""

from __future__ import annotations

import subprocess
import sys

from toolaudit.engines import cache_lock

PROBE = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print("free")
except BlockingIOError:
    print("held")
"""


def probe(lock_file) -> str:
    """What another process finds: the lock held or free (it never waits)."""
    return subprocess.run([sys.executable, "-c", PROBE, str(lock_file)], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_the_lock_is_held_for_the_block_and_beside_the_entry(tmp_path):
    target = tmp_path / "cache" / "smollm2-135m-0123456789"
    lock_file = target.parent / f".{target.name}.lock"
    with cache_lock.writing(target):
        assert lock_file.is_file() and not target.exists()  # the entry itself is the writer's to create
        assert probe(lock_file) == "held"
    assert probe(lock_file) == "free"


def test_a_writer_that_dies_inside_the_block_releases_the_lock(tmp_path):
    target = tmp_path / "entry"
    code = ("import os, sys; from pathlib import Path; from toolaudit.engines import cache_lock\n"
            "with cache_lock.writing(Path(sys.argv[1])):\n    os._exit(9)\n")
    assert subprocess.run([sys.executable, "-c", code, str(target)]).returncode == 9
    assert probe(tmp_path / ".entry.lock") == "free"
