"""Engines replay recorded requests on one decode path and return one `EngineResult` per request.

`TorchEngine` (embedded, CPU or CUDA) is the reference; `OpenAIEngine` replays against any OpenAI-compatible
endpoint; both implement the `Engine` protocol. Importing this package imports neither torch nor openai:
`make_engine` loads what the path's engine needs.
"""

from __future__ import annotations

from ..errors import ConfigError
from ..paths import PathConfig
from .base import Engine, EngineRequest, EngineResult, error_result

__all__ = ["Engine", "EngineRequest", "EngineResult", "error_result", "make_engine"]


def make_engine(path: PathConfig) -> Engine:
    """The engine a path names. Unknown engines are a `ConfigError` naming the path."""
    if path.engine == "torch":
        from .torch_engine import TorchEngine

        return TorchEngine(path)
    if path.engine == "openai":
        from .openai_engine import OpenAIEngine

        return OpenAIEngine(path)
    raise ConfigError(f"paths.{path.name}: engine {path.engine!r} is not available yet (available: torch, openai)")
