"""The `history_db` fixture: the canary history of `scenario.py`, built once per session (no test writes it)."""

from __future__ import annotations

import pytest

from .scenario import build


@pytest.fixture(scope="session")
def history_db(tmp_path_factory):
    db = tmp_path_factory.mktemp("history") / "canary.duckdb"
    return db, build(db)
