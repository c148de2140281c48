"""The embedded engine: replays requests through a Hugging Face model in-process (CPU or CUDA).

It is the reference implementation, small enough to read and exact in float64 (see `loop`). Modules:
`engine` (TorchEngine), `loop` (the decode loop), `kv` (the batched KV cache), `attention` (the split cache
layer and the attention that reads it), `prefix_cache`, `proposers` (speculation), `models` (finding, converting
and loading weights), `numerics` (bf16/fp16 emulated on float32 kernels where the CPU lacks them),
`prompting` (rendering requests), `config` (its path keys). Importing this package imports
no torch: `create` does.
"""

from __future__ import annotations

from ..base import Engine
from ..paths import PathConfig


def create(path: PathConfig) -> Engine:
    """A `TorchEngine` for `path` (the registry's factory); the model loads on first use."""
    from .engine import TorchEngine

    return TorchEngine(path)
