"""Load the models the embedded engine runs: its own attention, numerics and linear kernels on the weights
`toolaudit.engines.models` finds and converts (shared by every in-process engine)."""

from __future__ import annotations

import threading
from typing import Any

from toolaudit import ConfigError

from ..models import converted_dir, resolve

_loaded: dict[tuple[str, str, str, str, bool], tuple[Any, Any]] = {}
_lock = threading.Lock()


def load_model(spec: str, dtype: str = "bfloat16", device: str = "cpu",
               numerics: str = "native", invariant: bool = False) -> tuple[Any, Any]:
    """(model, tokenizer) in eval mode, shared in-process by (spec, dtype, device, numerics) so paths reuse
    weights (and the prefix cache, which is per model object).

    The model runs `attention.grouped_attention` (registered as "toolaudit"), whatever the checkpoint asked for.
    `numerics="emulated"` (see `numerics.resolve`): loaded in `dtype` as a native path would be, then run on
    float32 kernels with `dtype` rounding (`numerics.emulate`). float32, emulated and native bf16 CPU models run
    their linears on prepacked oneDNN weights where the build has them (`gemm.kernel`, `gemm.prepack_linears`).
    `invariant`: batch-invariant kernels (`invariant.py`), a separate model object (and prefix cache).
    """
    if numerics not in ("native", "emulated"):
        raise ValueError(f"numerics must be resolved to native or emulated (got {numerics!r}): numerics.resolve")
    key = (spec, dtype, device, numerics, invariant)
    with _lock:
        if key in _loaded:
            return _loaded[key]
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from .attention import use_grouped_attention
        from .gemm import PREPACKED, kernel, prepack_linears
        from .invariant import tile_linears, use_invariant_attention
        from .numerics import emulate

        directory = converted_dir(resolve(spec))
        torch_dtype = getattr(torch, dtype)
        try:
            tokenizer = AutoTokenizer.from_pretrained(directory)
            model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch_dtype)
        except OSError as exc:
            raise ConfigError(f"model {spec!r}: cannot load from {directory}: {exc}") from None
        model.to(device)
        (use_invariant_attention if invariant else use_grouped_attention)(model)
        if numerics == "emulated":
            emulate(model, torch_dtype)
        if kernel(numerics, device, dtype) == PREPACKED:
            prepack_linears(model)
        if invariant:
            tile_linears(model)
        model.eval()
        model.requires_grad_(False)
        _loaded[key] = (model, tokenizer)
        return model, tokenizer
