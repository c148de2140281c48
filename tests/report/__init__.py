"""Report tests. A package so this folder's conftest loads as `report.conftest`, leaving tests/conftest.py the
module that `from conftest import ...` finds."""
