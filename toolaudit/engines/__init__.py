"""Engines replay recorded requests on one decode path and return one `EngineResult` per request.

`base` is the contract (`Engine`, its `Capabilities`, requests and results); `registry` finds the engines,
built-in and plug-in alike, through the `toolaudit.engines` entry points; `local` is the skeleton the
in-process engines share; `models`, `prompting` and `devices` are what those engines share about weights,
prompts and chips. Each engine is one folder: a light `config` module exposing `ENGINE` (an `EngineSpec`: its
own `[paths.NAME]` keys, validated without importing torch, openai or vLLM, and its capabilities) and the
engine class it names, imported on first use.

Importing this package sets a passive OpenMP wait policy unless the user set one (`threads.quiet_openmp`):
libgomp reads it once, when torch first loads, and every torch import of toolaudit's comes after this one.

This module imports neither `.paths` (which imports the registry, to validate engine names) nor any engine's
package.
"""

from __future__ import annotations

from .base import Capabilities, Engine, EngineRequest, EngineResult, charged_seconds, error_result
from .registry import ENGINES, EngineSpec, Registry
from .threads import quiet_openmp

quiet_openmp()  # before anything imports torch: none of the modules above does (see `threads`)

__all__ = ["ENGINES", "Capabilities", "Engine", "EngineRequest", "EngineResult", "EngineSpec", "Registry",
           "charged_seconds", "error_result", "make_engine"]


def make_engine(path) -> Engine:
    """The engine a `PathConfig` names (nothing loads yet). An unknown, broken or doubly registered engine
    is a `ConfigError` naming the path (and, for a plug-in, its distribution and entry point)."""
    return ENGINES.spec(path.engine, f"paths.{path.name}").create(path)
