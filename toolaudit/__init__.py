"""toolaudit: measure how often two decode paths produce different tool calls for the same request.

The package root holds the version, the typed errors every wing raises on purpose (the CLI turns them into
messages that name the file, line and field) and, imported on first use, the Python API (`toolaudit.open`,
`toolaudit.compare`, `toolaudit.replay`: toolaudit/api/__init__.py, docs/api.md)."""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# the Python API (toolaudit/api/, docs/api.md)
_API = ("open", "compare", "replay", "Database", "Run", "Summary")


def __getattr__(name: str):
    """`toolaudit.compare(...)` and friends, imported on first use: `import toolaudit` stays light (the CLI's
    errors import nothing else)."""
    if name in _API:  # a lazy import (PEP 562): the API imports the wings, which import this module's errors
        return getattr(importlib.import_module("toolaudit.api"), name)
    raise AttributeError(f"module 'toolaudit' has no attribute {name!r}")


def callable_package(module_name: str, verb: str) -> None:
    """Make the package `module_name` (`toolaudit.compare`, `toolaudit.replay`) callable as the Python API's
    `verb`: the wing that does the work is also the API's verb, as `import toolaudit` users expect, and its
    modules import as before. The API is imported on the first call (it imports the wings)."""
    import sys
    import types

    class _Verb(types.ModuleType):
        def __call__(self, *args, **kwargs):
            return getattr(importlib.import_module("toolaudit.api"), verb)(*args, **kwargs)

    sys.modules[module_name].__class__ = _Verb


class ToolauditError(Exception):
    """Base class for every error the library raises on purpose."""


class TraceError(ToolauditError):
    """A trace line that cannot be used. Carries where it came from so the message can say so."""

    def __init__(self, path: str, line: int | None, field: str | None, message: str):
        self.path, self.line, self.field, self.message = path, line, field, message
        where = path if line is None else f"{path}:{line}"
        super().__init__(f"{where}: {field + ': ' if field else ''}{message}")


class StoreError(ToolauditError):
    """The database cannot be opened or written (not DuckDB, locked, wrong schema version)."""


class RunNotFound(StoreError):
    """No run answers to the id or name asked for, the database holds no runs, or there is no database file to
    read: the CLI exits 2 for it, as for a usage error (docs/reliability.md#exit-codes)."""


class ConfigError(ToolauditError):
    """A decode-path configuration (paths.toml) or CLI option that cannot be used."""


class UsageError(ToolauditError):
    """The command line names something that is not there or asks what cannot be done as given (a trace file
    that does not exist, an unknown decode path, options that do not go together): the CLI exits 2 for it, as
    for click's own usage errors (docs/reliability.md#exit-codes), where a failure while running exits 1.
    Raised as one of the subclasses below, so code that catches ConfigError, TraceError or StoreError still does."""


class OptionError(ConfigError, UsageError):
    """A CLI option (or option combination) that cannot be used as given."""


class TraceFileNotFound(TraceError, UsageError):
    """A trace file named on the command line that does not exist."""

    def __init__(self, path: str, message: str = "cannot open trace file: No such file or directory"):
        super().__init__(path, None, None, message)


class DatabaseFolderMissing(StoreError, UsageError):
    """A --db path in a folder that does not exist (DuckDB would say only that it cannot open the file)."""
