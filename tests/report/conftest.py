"""The `report_db` fixture: the three-customer scenario from `scenario.py`, stored as runs 1 and 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from .scenario import build_db


@pytest.fixture
def report_db(tmp_path, db_path) -> Path:
    build_db(tmp_path, db_path)
    return db_path
