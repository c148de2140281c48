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

from dataclasses import dataclass
from typing import Any

from ..base import Capabilities
from ..options import Fail, key
from ..registry import EngineSpec

KV_CACHES = ("static", "dynamic")
SPEC_METHODS = ("ngram", "draft_model")
NUMERICS = ("auto", "native", "emulated")
LOW_PRECISION_DTYPES = ("bfloat16", "float16")


@dataclass(frozen=True)
class TorchOptions:
    """The torch engine's own keys. None: decided by the device (`layout.py`) or the machine (`threads`)."""

    numerics: str = key("auto", allowed=NUMERICS, doc="bf16/fp16 numerics: native kernels or emulated on float32")
    threads: int | None = key(None, low=1, doc="torch threads while the path runs (default: the free cores)")
    kv_cache: str | None = key(None, allowed=KV_CACHES, doc="static or dynamic KV cache (default by device)")
    cuda_graphs: bool | None = key(None, doc="capture the fixed-shape step as CUDA graphs (default on CUDA)")
    max_batch: int | None = key(None, low=1, doc="rows decoding together (default by device and memory)")
    compile: bool | None = key(None, doc="the fixed-shape step through torch.compile")
    batch_invariant: bool | None = key(None, doc="a row's numbers independent of the rest of its batch")


def check(options: TorchOptions, table: dict[str, Any], fail: Fail) -> None:
    """The speculative method, and emulated numerics only for a low-precision dtype."""
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
    dtype = table.get("dtype", "bfloat16")
    if options.numerics == "emulated" and dtype not in LOW_PRECISION_DTYPES:
        raise fail("numerics", f"'emulated' applies to bfloat16 and float16 only (dtype is {dtype})")


CAPABILITIES = Capabilities(sees_logits=True, decodes_tokens=True, holds_together=True, in_process=True,
                            overrides=frozenset({"numerics"}))
# Only the keys a table sets land in PathConfig.options (store_defaults=False): a path's stored config and its
# fingerprint name what the user chose, and the device decides the rest when the engine loads.
ENGINE = EngineSpec(name="torch", factory="toolaudit.engines.torch.engine:TorchEngine", options=TorchOptions,
                    check=check, store_defaults=False, capabilities=CAPABILITIES)
KEYS = ENGINE.keys
