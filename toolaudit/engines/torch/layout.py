"""How a torch path lays out its decoding: which KV cache, fixed shapes or not, CUDA graphs, rows in flight.

The path keys (`config.py`): `kv_cache = "static" | "dynamic"`, `cuda_graphs = true | false`, `max_batch`.
Defaults follow the device:
- CUDA: static KV with fixed shapes (batch-size buckets, verify width k+1), captured as CUDA graphs, and as many
  rows in flight as a quarter of the device's memory holds for the KV of 4,096-token rows (`max_batch`, at most
  256): a GPU step costs about the same for 1 row or 64, so a replay should keep it full. Sized from the
  device's total memory, not its momentary free memory, so a path's rows (and fingerprint) repeat on the same GPU.
- CPU: the growing cache (`kv.KVBatch`, measured the faster one there, see docs/benchmarks.md) and `batch_size`
  rows; `kv_cache = "static"` runs the static cache with exact shapes (no padding work).
A layout is part of a path's numerics (shapes change reduction orders), so `components` names it in the
fingerprint; CPU paths on the defaults add nothing, keeping the fingerprints of earlier runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toolaudit import ConfigError

from .config import TorchOptions

MAX_AUTO_BATCH = 256
MAX_FIXED_ROWS = 512  # the largest batch-size bucket of a fixed-shape step (`static_kv.BUCKETS`)
KV_MEMORY_SHARE = 0.25  # of the GPU's memory, for the KV buffers of the rows in flight
SIZING_COLUMNS = 4096  # tokens per row assumed when sizing `max_batch`


@dataclass(frozen=True)
class Layout:
    """A path's resolved decoding layout."""

    kv_cache: str  # "static" or "dynamic"
    fixed_shapes: bool  # buckets, padded widths, every column (CUDA), else exact shapes
    cuda_graphs: bool
    rows: int  # rows decoding together
    compiled: bool = False  # the fixed-shape step runs through torch.compile (fused kernels; other numerics)
    batch_invariant: bool = False  # tiled GEMMs and block-wise attention (`invariant.py`) on the static cache

    def components(self, device: str) -> dict[str, Any]:
        """Fingerprint components: none for a CPU path on the defaults."""
        if not device.startswith("cuda") and self.kv_cache == "dynamic":
            return {}
        # `compile` only when on: paths without it keep the fingerprints they had before the key existed.
        return {"kv_cache": self.kv_cache, "fixed_shapes": self.fixed_shapes, "cuda_graphs": self.cuda_graphs,
                "max_batch": self.rows, **({"compile": True} if self.compiled else {}),
                **({"batch_invariant": True} if self.batch_invariant else {})}


def resolve_layout(options: TorchOptions, device: str, batch_size: int, kv_bytes_per_token: int | None = None,
                   device_bytes: int | None = None, name: str = "?") -> Layout:
    """The layout a path's options ask for on `device` (a key left None is decided here, by device).
    `kv_bytes_per_token` and `device_bytes` size the automatic `max_batch` on CUDA (either None: `batch_size`)."""
    cuda = device.startswith("cuda")
    invariant = bool(options.batch_invariant)
    kv_cache = options.kv_cache or ("static" if cuda or invariant else "dynamic")
    if invariant and kv_cache != "static":
        raise ConfigError(f"paths.{name}: batch_invariant = true needs kv_cache = \"static\" (a row's columns "
                          "are its own there)")
    graphs = options.cuda_graphs if options.cuda_graphs is not None else cuda and kv_cache == "static"
    if graphs and not cuda:
        raise ConfigError(f"paths.{name}: cuda_graphs = true needs a CUDA device (device is {device!r})")
    if graphs and kv_cache != "static":
        raise ConfigError(f"paths.{name}: cuda_graphs = true needs kv_cache = \"static\"")
    compiled = bool(options.compile)
    fixed = cuda and kv_cache == "static"
    if compiled and not fixed:
        raise ConfigError(f"paths.{name}: compile = true needs the fixed-shape step (kv_cache = \"static\" on CUDA)")
    rows = options.max_batch
    if rows is None:
        rows = batch_size
        if cuda and kv_bytes_per_token and device_bytes:
            per_row = kv_bytes_per_token * SIZING_COLUMNS
            rows = max(1, min(MAX_AUTO_BATCH, int(device_bytes * KV_MEMORY_SHARE) // per_row))
    if fixed and rows > MAX_FIXED_ROWS:
        # Fixed shapes run batch-size buckets; more rows than the largest bucket would have no slot to go to.
        raise ConfigError(f"paths.{name}: max_batch {rows} is more than the largest fixed-shape bucket "
                          f"({MAX_FIXED_ROWS}); set max_batch <= {MAX_FIXED_ROWS}")
    return Layout(kv_cache=kv_cache, fixed_shapes=fixed, cuda_graphs=bool(graphs), rows=rows, compiled=compiled,
                  batch_invariant=invariant)


def kv_bytes_per_token(model_spec: str, dtype: str) -> int:
    """KV bytes one token takes in every layer of a model (its config read from the converted directory)."""
    import json

    from ..models import converted_dir, resolve

    config = json.loads((converted_dir(resolve(model_spec)) / "config.json").read_text())
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    width = {"float32": 4, "float64": 8}.get(dtype, 2)
    return config["num_hidden_layers"] * 2 * config.get("num_key_value_heads", heads) * head_dim * width
