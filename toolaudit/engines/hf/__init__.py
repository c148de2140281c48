"""The hf engine: replays requests through Hugging Face `model.generate()`, called as offline eval harnesses
call it (stock attention, generate's own decode loop, prompt lookup or an assistant model for speculation).

It exists because an eval harness and a serving stack are two decode paths: the seed incident ran offline
evals with `generate()` and production on vLLM with a draft model. Prompts are rendered exactly as the torch
engine renders them, so hf, torch and vLLM paths see identical prompt tokens. Modules: `engine` (HFEngine),
`config` (its path keys). Importing this package imports no torch or transformers: `create` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..base import Engine


def create(path) -> Engine:
    """An `HFEngine` for `path` (the registry's factory); the model loads on first `generate`."""
    from .engine import HFEngine

    return HFEngine(path)
