"""The HTTP engine: replays requests against any OpenAI-compatible Chat Completions endpoint (vLLM, SGLang, a
gateway, `toolaudit serve`). Modules: `engine` (OpenAIEngine: client, retries, key handling), `shapes` (request
and response bodies), `config` (its path keys). Importing this package imports no openai: `create` does.
"""

from __future__ import annotations

from ..base import Engine
from ..paths import PathConfig


def create(path: PathConfig) -> Engine:
    """An `OpenAIEngine` for `path` (the registry's factory): validates its keys and finds its API key now."""
    from .engine import OpenAIEngine

    return OpenAIEngine(path)
