"""Replaying recorded calls through live decode paths: inputs, the chunked resumable replayer, token
evidence, and the OpenAI Batch route.

This package imports nothing on import: its modules are imported by name."""

def _callable() -> None:
    """`toolaudit.replay(...)` is the Python API's `replay` (`toolaudit/api/__init__.py`, imported on first call): the
    package that does the work is also the API's verb, as `import toolaudit` users expect; its modules import
    as before (`toolaudit.replay.<module>`)."""
    import importlib
    import sys
    import types

    class _Verb(types.ModuleType):
        def __call__(self, *args, **kwargs):
            return importlib.import_module("toolaudit.api").replay(*args, **kwargs)  # lazy: the API imports this

    sys.modules[__name__].__class__ = _Verb


_callable()
