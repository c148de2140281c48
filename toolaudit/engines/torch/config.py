"""The torch engine's part of a `[paths.NAME]` table. Model, dtype, device, batch size, sampling, speculative,
prompt and prefix caching are common keys (`toolaudit.engines.paths`). Its own keys:

- `numerics = "auto" | "native" | "emulated"`: how a bfloat16/float16 path gets its numerics. "native" runs
  low-precision kernels; "emulated" rounds to the dtype on float32 kernels (`numerics.py`: same numerics,
  float32 speed on CPUs without native bf16/fp16 matmul); "auto" (default) picks native where the device has it.
- `threads`: torch threads while this path runs (default: $OMP_NUM_THREADS, else the cores the process may use
  that other processes leave free, `engines.threads`).
- `kv_cache = "static" | "dynamic"`, `cuda_graphs = true | false`, `max_batch` (rows decoding together),
  `compile = true | false` (the fixed-shape step through `torch.compile`: fused kernels): the decoding layout,
  defaults by device (`layout.py`: static, graphs and wide batches on CUDA).
- `batch_invariant = true`: a row's numbers do not depend on the other rows or positions of its forward pass
  (`invariant.py`: tiled GEMMs, block-wise attention on the static cache): batching noise removed, and
  speculation exact in low precision too.

Also its own: which speculative methods it runs. No heavy imports: paths.toml is read before any engine loads.
Only the keys a table sets land in the options; the engine applies the defaults. `ENGINE` is what the
`toolaudit.engines` entry point `torch` names: these keys, the engine class and its capabilities (`numerics`
is the key a run-wide `--numerics` overrides).
"""

from __future__ import annotations

from typing import Any, Callable

from toolaudit import ConfigError

from ..base import Capabilities
from ..registry import EngineSpec

KEYS: frozenset[str] = frozenset({"numerics", "threads", "kv_cache", "cuda_graphs", "max_batch", "compile",
                                   "batch_invariant"})
KV_CACHES = ("static", "dynamic")
SPEC_METHODS = ("ngram", "draft_model")
NUMERICS = ("auto", "native", "emulated")
LOW_PRECISION_DTYPES = ("bfloat16", "float16")


def parse_options(table: dict[str, Any], fail: Callable[[str, str], ConfigError]) -> dict[str, Any]:
    """Check the speculative method, `numerics` and `threads` (common parsing checked the rest of the table)."""
    spec = table.get("speculative")
    if spec is not None:
        method, model = spec.get("method"), spec.get("model")
        if method not in SPEC_METHODS:
            raise fail("speculative.method", f"must be one of {', '.join(SPEC_METHODS)}")
        if method == "draft_model":
            if not isinstance(model, str) or not model:
                raise fail("speculative.model", "is required for method draft_model (a model sharing the tokenizer)")
        elif model is not None:
            raise fail("speculative.model", "is only used with method draft_model")
    options: dict[str, Any] = {}
    if "numerics" in table:
        numerics = table["numerics"]
        if numerics not in NUMERICS:
            raise fail("numerics", f"must be one of {', '.join(NUMERICS)} (got {numerics!r})")
        dtype = table.get("dtype", "bfloat16")
        if numerics == "emulated" and dtype not in LOW_PRECISION_DTYPES:
            raise fail("numerics", f"'emulated' applies to bfloat16 and float16 only (dtype is {dtype})")
        options["numerics"] = numerics
    for key in ("threads", "max_batch"):
        if key in table:
            value = table[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise fail(key, f"must be a positive integer (got {value!r})")
            options[key] = value
    if "kv_cache" in table:
        if table["kv_cache"] not in KV_CACHES:
            raise fail("kv_cache", f"must be one of {', '.join(KV_CACHES)} (got {table['kv_cache']!r})")
        options["kv_cache"] = table["kv_cache"]
    for key in ("cuda_graphs", "compile", "batch_invariant"):
        if key in table:
            if not isinstance(table[key], bool):
                raise fail(key, f"must be true or false (got {table[key]!r})")
            options[key] = table[key]
    return options


CAPABILITIES = Capabilities(sees_logits=True, decodes_tokens=True, holds_together=True, in_process=True,
                            overrides=frozenset({"numerics"}))
ENGINE = EngineSpec(name="torch", factory="toolaudit.engines.torch.engine:TorchEngine", keys=KEYS,
                    parse_options=parse_options, capabilities=CAPABILITIES)
