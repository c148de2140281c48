"""Early-exit self-drafts: a model's first N decoder layers, with its own embedding, final norm and LM head,
written as an ordinary Hugging Face model directory.

Speculative decoding with a draft model needs a small model that shares the target's tokenizer; the project
ships one model only (SmolLM2-135M). A truncated copy of the target is such a model (LayerSkip's early-exit
self-speculation, without LayerSkip's training for early exit, so acceptance is what the untrained exit gives).
Because it is a plain directory (config.json with `num_hidden_layers = N`, safetensors, tokenizer files,
generation config), every engine loads it as it loads any draft: the torch engine's `DraftModelProposer`,
transformers' `assistant_model`, vLLM's `speculative_config = {"method": "draft_model", "model": DIR}`.

The copy is deterministic (same source, same N: same bytes) and written to a temporary directory renamed into
place, so a killed derivation never leaves a half-written draft. `toolaudit-source.json` records the source
and the size and mtime of its weight files: a draft whose source changed is derived again. Only this module
writes drafts; `toolaudit.engines.models` names them (`smollm2-135m:first8`) and decides where they live.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from toolaudit import ConfigError

from . import cache_lock

# Decoder-layer tensors: "model.layers.7.mlp.up_proj.weight" (Llama, Qwen, Mistral, ... all name them so).
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
# Config lists with one entry per layer, cut to the first N with the layers.
_PER_LAYER_KEYS = ("layer_types", "no_rope_layers")
# Files that are not copied as they are: the weights (rewritten), their index and the config (rewritten), and
# the source's provenance note (replaced by the draft's own).
_REWRITTEN = ("config.json", "model.safetensors.index.json", "toolaudit-source.json")
SOURCE_NOTE = "toolaudit-source.json"


@dataclass(frozen=True)
class DraftModel:
    """A derived draft directory: what it holds, and where it came from."""

    directory: Path
    layers: int  # decoder layers kept (the first `layers` of the source)
    source_layers: int  # decoder layers of the source model
    parameters: int  # parameters stored (the tied embedding / LM head counted once)
    source: Path  # the source model directory


def derive(source: Path, layers: int, target: Path) -> DraftModel:
    """The draft of `source`'s first `layers` layers at `target`: reused when it is there and its source has
    not changed, else written (atomically). Raises `ConfigError` when `layers` is not below the source's count."""
    config = _read_config(source)
    total = config.get("num_hidden_layers")
    if not isinstance(total, int):
        raise ConfigError(f"model {source}: config.json has no num_hidden_layers (not a decoder-only model)")
    if not 1 <= layers < total:
        raise ConfigError(f"draft layers (--layers, or :firstN) must be between 1 and {total - 1} for {source.name} "
                          f"({total} layers; got {layers})")
    note = {"source": str(source), "layers": layers, "source_layers": total, "weights": _signature(source)}
    cache_lock.once(target, lambda: _note(target) == note, lambda: _write(source, config, layers, target, note))
    return describe(target)


def describe(directory: Path) -> DraftModel:
    """What a derived draft directory holds (from its provenance note and weights; nothing is loaded)."""
    from safetensors import safe_open

    note = _note(directory)
    if note is None:
        raise ConfigError(f"{directory}: not a derived draft (no {SOURCE_NOTE} with its layers)")
    parameters = 0
    with safe_open(directory / "model.safetensors", "pt") as f:
        for key in f.keys():
            n = 1
            for dim in f.get_slice(key).get_shape():
                n *= dim
            parameters += n
    return DraftModel(directory=directory, layers=note["layers"], source_layers=note["source_layers"],
                      parameters=parameters, source=Path(note["source"]))


def _write(source: Path, config: dict, layers: int, target: Path, note: dict) -> None:
    from safetensors.torch import save_file

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        tensors = {name: t for name, t in _weights(source).items()
                   if (m := _LAYER.search(name)) is None or int(m.group(1)) < layers}
        save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
        draft_config = dict(config, num_hidden_layers=layers)
        for key in _PER_LAYER_KEYS:
            if isinstance(draft_config.get(key), list):
                draft_config[key] = draft_config[key][:layers]
        (tmp / "config.json").write_text(json.dumps(draft_config, indent=2, sort_keys=True) + "\n")
        for file in sorted(source.iterdir()):
            if file.is_file() and file.suffix not in (".safetensors", ".bin") and file.name not in _REWRITTEN:
                shutil.copyfile(file, tmp / file.name)
        (tmp / SOURCE_NOTE).write_text(json.dumps(note, indent=2, sort_keys=True) + "\n")
        if target.exists():  # a stale draft (its source changed): replaced whole
            shutil.rmtree(target)
        try:
            os.rename(tmp, target)
        except OSError:
            if _note(target) != note:  # another process did not win the race with the same draft
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _weights(source: Path) -> dict:
    """Every tensor of the source's safetensors files (one file or shards), by name."""
    from safetensors.torch import load_file

    files = sorted(source.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"model {source}: no .safetensors weights to derive a draft from")
    tensors: dict = {}
    for file in files:
        tensors.update(load_file(file))
    return tensors


def _signature(source: Path) -> dict[str, list[int]]:
    return {f.name: [f.stat().st_size, f.stat().st_mtime_ns] for f in sorted(source.glob("*.safetensors"))}


def _read_config(source: Path) -> dict:
    try:
        return json.loads((source / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"model {source}: cannot read config.json: {exc}") from None


def _note(directory: Path) -> dict | None:
    try:
        note = json.loads((directory / SOURCE_NOTE).read_text())
    except (OSError, ValueError):
        return None
    return note if isinstance(note, dict) and "layers" in note else None
