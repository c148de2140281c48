"""The embedded engine: replays requests through a Hugging Face model in-process with the decode loop of
`loop.py`. It is the reference implementation: small enough to read, and exact (in float64 its speculative
paths equal target greedy token for token), so any drift it shows in bf16 comes from numerics.

Cost model on a 2-core CPU (SmolLM2-135M, bf16): prefill ~1 ms per uncached prompt token; a decode step
~40 ms for one row, ~90 ms for 16 rows (weights and KV cache are read once per step, so batching pays);
a verification pass with 5 proposals costs about one step at batch 1 and ~2 steps at batch 16. Hence:
continuous batching (pass many requests per `generate` call so slots stay full), a prefix cache shared by all
paths on the same weights (a second path replaying the same prompts runs no prefill at all), and requests
kept in the order given (a session's calls extend each other's prompts). On CPUs without native bf16/fp16
matmul, low-precision paths run emulated numerics on float32 kernels (`numerics`, the path's `numerics` key).
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import weakref
from typing import Any

from toolaudit import ConfigError

from ..base import EngineRequest, EngineResult
from ..completion import row_seed
from ..devices import device_name
from ..local import LocalEngine, Prompt
from ..models import check_draft_compatible, eos_ids, max_positions
from .config import CAPABILITIES, ENGINE
from .gemm import DEFAULT as DEFAULT_GEMM
from .gemm import kernel as gemm_kernel
from .graphs import StepGraphs
from .layout import Layout, kv_bytes_per_token, resolve_layout
from .loop import DecodeSettings, decode
from .models import load_model
from .numerics import cpu_capability, resolve
from .prefix_cache import PREFIX_REUSE, PathPrefix, PrefixCache
from .proposers import DraftModelProposer, NgramProposer
from .static_kv import StaticKV

# One prefix cache per loaded model: every path on the same weights shares prompt KV (see `PrefixCache`).
_prefix_caches: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def prefix_cache_for(model) -> PrefixCache:
    """The prefix cache shared by every engine that runs `model`; its size comes from $TOOLAUDIT_PREFIX_CACHE_MB."""
    cache = _prefix_caches.get(model)
    if cache is None:
        megabytes = int(os.environ.get("TOOLAUDIT_PREFIX_CACHE_MB", "2048"))
        cache = _prefix_caches[model] = PrefixCache(max_bytes=megabytes << 20)
    return cache


class TorchEngine(LocalEngine):
    """One decode path on the embedded engine. Models load on first use and are shared between engines (and
    kept by `models.load_model` for the process: `close` only lets this engine's references go)."""

    name = "torch"
    capabilities = CAPABILITIES
    draft_proposer = DraftModelProposer  # what a draft-model path proposes with (a plug-in may name a subclass)

    def __init__(self, path):
        super().__init__(path)
        self.options = ENGINE.read(path.options)  # TorchOptions: the path's keys, typed
        self._draft = None
        self._eos: frozenset[int] = frozenset()
        self._positions: int | None = None
        self._static: dict[int, StaticKV] = {}  # fixed-shape caches (and their graphs) kept between calls, by model
        self._prefixes: dict[int, PathPrefix] = {}  # this path's use of each model's shared prefix cache

    @functools.cached_property
    def layout(self) -> Layout:
        """KV cache, shapes, CUDA graphs and rows in flight for this path on its device (`layout.py`)."""
        p = self.path
        per_token = device_bytes = None
        if p.device.startswith("cuda") and self.options.max_batch is None:
            import torch

            if torch.cuda.is_available():
                per_token = kv_bytes_per_token(p.model, p.dtype)
                device_bytes = torch.cuda.get_device_properties(p.device).total_memory
        return resolve_layout(self.options, p.device, p.batch_size, per_token, device_bytes, p.name)

    @property
    def rows_in_flight(self) -> int:
        return self.layout.rows

    @property
    def numerics(self) -> str:
        """"native" or "emulated": the path's `numerics` key resolved for its dtype, device and this CPU."""
        p = self.path
        try:
            return resolve(p.dtype, p.device, self.options.numerics)
        except ConfigError as exc:
            raise ConfigError(f"paths.{p.name}: {exc}") from None

    # ------------------------------------------------------------------ loading

    def _load(self) -> None:
        """Load (or reuse) the model and, for draft_model speculation, the draft; check they are compatible."""
        import torch

        p = self.path
        if p.device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"paths.{p.name}: device {p.device!r} but CUDA is not available")
        self.layout  # noqa: B018 (a layout the device cannot run fails the load, with the key to change)
        if p.device == "cpu":
            keep_freed_memory()
        numerics = self.numerics
        model, tokenizer = load_model(p.model, p.dtype, p.device, numerics, self.layout.batch_invariant)
        if p.speculative is not None and p.speculative.method == "draft_model":
            draft, draft_tokenizer = load_model(p.speculative.model, p.dtype, p.device, numerics)
            check_draft_compatible(model.config.vocab_size, draft.config.vocab_size, tokenizer, draft_tokenizer)
            self._draft = draft
        self._eos, self._positions = frozenset(eos_ids(model, tokenizer)), max_positions(model)
        self._model, self._tokenizer = model, tokenizer

    def _release(self) -> None:
        self._model = self._tokenizer = self._draft = None
        self._pieces = {}
        self._static = {}
        self._prefixes = {}

    # ------------------------------------------------------------------ generation

    def _context_limit(self) -> tuple[int, str] | None:
        return (self._positions, f"the model's {self._positions} positions") if self._positions else None

    def _decode(self, requests: list[EngineRequest], prompts: list[Prompt]) -> list[EngineResult]:
        """All requests in one continuous batch: up to `batch_size` rows decode together, a finished row is
        refilled from the queue."""
        settings = self.decode_settings(requests)
        cache = self._prefix(self._model)
        outputs = decode(self._model, [prompt.ids for prompt in prompts], settings, self._proposer(), cache,
                         batch_size=self.layout.rows, new_kv=self._new_kv(self._model))
        # Prefill other paths ran for these prompts, charged here in equal shares (a chunk's time is shared out
        # to its calls equally in any case).
        reused = sum(view.take_reused() for view in self._prefixes.values()) / len(requests)
        return [EngineResult(
            key=req.key, text=self._text(prompt.prefill, out.token_ids), token_ids=out.token_ids,
            prompt_tokens=len(prompt.ids), completion_tokens=len(out.token_ids), latency_s=out.latency_s,
            ttft_s=out.ttft_s, drafted_tokens=out.drafted, accepted_tokens=out.accepted,
            forward_passes=out.forward_passes, margins=out.margins, top2=out.top2, finish_reason=out.finish_reason,
            top_logprobs=[t[:req.logprobs] for t in out.top_logprobs] if req.logprobs else [],
            reused_prefill_s=reused,
        ) for req, prompt, out in zip(requests, prompts, outputs)]

    def _prefix(self, model) -> PathPrefix | None:
        """This path's view of `model`'s shared prefix cache (None without prefix caching)."""
        if not self.path.prefix_caching:
            return None
        view = self._prefixes.get(id(model))
        if view is None:
            view = self._prefixes[id(model)] = PathPrefix(prefix_cache_for(model))
        return view

    def decode_settings(self, requests: list[EngineRequest]) -> DecodeSettings:
        """How this path decodes a batch: its limits, stops, sampling and each request's own seed."""
        p = self.path
        return DecodeSettings(
            max_tokens=p.max_tokens, temperature=p.temperature, eos_ids=self._eos,
            stop_strings=p.stop_strings, value_end=p.value_end, piece=self._piece,
            seeds=tuple(row_seed(p.seed, r.key, r.sample) for r in requests), top_p=p.top_p, top_k=p.top_k,
            logprobs=max((r.logprobs for r in requests), default=0),
        )

    def _proposer(self):
        spec = self.path.speculative
        if spec is None:
            return None
        if spec.method == "ngram":
            return NgramProposer(spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max)
        return self.draft_proposer(self._draft, spec.num_speculative_tokens, self.path.temperature,
                                   self._prefix(self._draft),
                                   new_kv=self._new_kv(self._draft), top_p=self.path.top_p, top_k=self.path.top_k)

    def _new_kv(self, model):
        """The loop's KV factory for `model` under this path's layout (None: the loop's growing `KVBatch`).
        Fixed-shape caches are kept between calls: their buffers and captured graphs are reused."""
        layout = self.layout
        if layout.kv_cache == "dynamic":
            return None
        invariant = layout.batch_invariant and model is self._model  # the draft keeps its own kernels
        if not layout.fixed_shapes:
            return lambda rows, columns, width: StaticKV(model, rows, columns, invariant=invariant)

        def fixed(rows: int, columns: int, width: int) -> StaticKV:
            kv = self._static.get(id(model))
            if kv is None:
                graphs = StepGraphs() if layout.cuda_graphs else None
                kv = self._static[id(model)] = StaticKV(model, layout.rows, columns, fixed=True, width=width,
                                                        graphs=graphs, compiled=layout.compiled,
                                                        invariant=invariant)
            return kv.reset()

        return fixed

    # ------------------------------------------------------------------ identity

    def path_components(self) -> dict[str, Any]:
        """What defines this path's numerics: versions, weights, draft, dtype and how it runs (native kernels or
        emulated on float32 ones, and the linear kernel if not torch's default; the CPU's vector ISA and
        low-precision flags), batch size, device, threads."""
        import torch
        import transformers

        p = self.path
        numerics = self.numerics
        # Paths on prepacked linears name them; paths on torch's default kernels (float64, CUDA) keep their
        # earlier fingerprints.
        gemm = gemm_kernel(numerics, p.device, p.dtype)
        kernel = {} if gemm == DEFAULT_GEMM else {"gemm": gemm}
        return {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            **self._weights(),
            "numerics": numerics,
            **kernel,
            "cpu_capability": cpu_capability(),
            "batch_size": p.batch_size,
            # Where a prompt's prefill starts changes its rounding: name how cached prefixes are found (whole blocks
            # and the longest common start of the next one, `PrefixCache`), so runs of the earlier block-only cache
            # keep their own fingerprints.
            "prefix_caching": PREFIX_REUSE if p.prefix_caching else False,
            "speculative": self._speculative("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max",
                                             "model"),
            "sampling": {"temperature": p.temperature, "seed": p.seed, "max_tokens": p.max_tokens,
                         **p.end_components(), **p.sampling_components()},
            "prompt": self._prompt(),
            "device": device_name(p.device),
            "torch_threads": self.threads_identity,
            **self.layout.components(p.device),
        }


@functools.lru_cache(maxsize=1)
def keep_freed_memory() -> bool:
    """Let glibc's malloc keep freed blocks of up to 64 MiB for reuse instead of unmapping them; True if set.

    Every structural change of a batch (rows joining, leaving, padding) copies KV layers of a few to tens of
    MB into fresh tensors. glibc serves those with mmap and unmaps them on free, so every copy page-faults its
    destination in first: 8x slower than copying into reused memory (12 ms against 1.5 ms for 29 MB here), and
    in emulated (float32) replays this was a third of prefill time. The cost is a resident set that stays at its
    peak. PyTorch's CPU tuning guide suggests jemalloc or tcmalloc for the same reason; this needs neither.
    Set TOOLAUDIT_MALLOC_TUNING=0 to leave malloc alone. No-op outside glibc.
    """
    if os.environ.get("TOOLAUDIT_MALLOC_TUNING", "1") == "0" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3  # <malloc.h>
    return all((libc.mallopt(m_mmap_threshold, 64 << 20), libc.mallopt(m_trim_threshold, 1 << 30),
                libc.mallopt(m_top_pad, 64 << 20)))
