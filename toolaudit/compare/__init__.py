"""Deciding drift: the argument-by-argument diff, the pairing of two outputs into rows, and the
comparison of two recorded logs (`compare_logs`, remedy matrices).

This package imports nothing on import: its modules are imported by name."""

def _callable() -> None:
    """`toolaudit.compare(...)` is the Python API's `compare` (`toolaudit/api/__init__.py`, imported on first call): the
    package that does the work is also the API's verb, as `import toolaudit` users expect; its modules import
    as before (`toolaudit.compare.<module>`)."""
    import importlib
    import sys
    import types

    class _Verb(types.ModuleType):
        def __call__(self, *args, **kwargs):
            return importlib.import_module("toolaudit.api").compare(*args, **kwargs)  # lazy: the API imports this

    sys.modules[__name__].__class__ = _Verb


_callable()
