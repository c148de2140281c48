"""Deciding drift: the argument-by-argument diff, the pairing of two outputs into rows, and the
comparison of two recorded logs (`compare_logs`, remedy matrices).

This package imports nothing on import: its modules are imported by name."""

from toolaudit import callable_package  # `toolaudit.compare(...)` is the Python API's verb

callable_package(__name__, "compare")
