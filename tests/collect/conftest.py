"""The receiver fixture: a `toolaudit collect` subprocess, stopped after the test."""

from __future__ import annotations

import pytest

from .support import CollectProcess


@pytest.fixture
def receiver(tmp_path):
    proc = CollectProcess(tmp_path / "collected", tmp_path / "collect.log")
    yield proc
    proc.stop()
