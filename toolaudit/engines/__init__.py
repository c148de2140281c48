"""Engines replay recorded requests on one decode path and return one `EngineResult` per request.

The registry below is the only place that knows which engines exist. Each engine is one folder: a package
exposing `create(path) -> Engine` and a light `config` module (its own `[paths.NAME]` keys, validated without
importing torch, openai or vLLM), so `paths.toml` can be read and checked on a machine that has none of them.
Adding an engine means one entry here and one folder.

This module imports neither `.paths` (which imports it, to validate engine names) nor any engine's package.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from toolaudit import ConfigError

from .base import Engine, EngineRequest, EngineResult, error_result

__all__ = ["ENGINES", "Engine", "EngineEntry", "EngineRequest", "EngineResult", "error_result", "make_engine"]


@dataclass(frozen=True)
class EngineEntry:
    """Where an engine lives. Modules are named, not imported: an engine's dependencies load on first use."""

    name: str  # the `engine = "..."` value of a path
    package: str  # exposes create(path) -> Engine
    config: str  # exposes KEYS (frozenset of engine-specific keys) and parse_options(table, fail) -> dict
    holds_together: bool = True  # False: two instances must not be loaded at the same time (e.g. vLLM's GPU pool)


ENGINES: dict[str, EngineEntry] = {entry.name: entry for entry in (
    EngineEntry("torch", "toolaudit.engines.torch", "toolaudit.engines.torch.config"),
    EngineEntry("openai", "toolaudit.engines.openai", "toolaudit.engines.openai.config"),
    # vLLM's CPU workers spin while waiting and two instances starve each other (or split GPU memory):
    # replays run one vLLM path over the whole selection, release it, then the next.
    EngineEntry("vllm", "toolaudit.engines.vllm", "toolaudit.engines.vllm.config", holds_together=False),
    EngineEntry("hf", "toolaudit.engines.hf", "toolaudit.engines.hf.config"),
)}


def make_engine(path) -> Engine:
    """The engine a `PathConfig` names. A path built in code with an unregistered engine is a `ConfigError`."""
    entry = ENGINES.get(path.engine)
    if entry is None:
        raise ConfigError(f"paths.{path.name}: engine {path.engine!r} is not available "
                          f"(available: {', '.join(ENGINES)})")
    return importlib.import_module(entry.package).create(path)
