"""The engine contract: what every engine takes, returns and declares, so replay and serve code never care
which engine produced a completion, nor probe one for what it can do.

An engine turns recorded requests into completions on one decode path. The contract that keeps a replay of
thousands of calls going: one `EngineResult` per request, in request order, and a failure of one request is
that result's `error`, never an exception that loses the rest of the batch. The lifecycle is explicit:
`load()` (idempotent; replay calls it outside the path's timings), `generate()`, `decode_tokens()` where the
engine declares it can, `fingerprint_components()`, `close()` (idempotent; frees models and workers, after
which the engine loads again on next use). What an engine can do is declared in `Capabilities`, not found out.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from toolaudit import ConfigError


@dataclass(frozen=True)
class Capabilities:
    """What an engine declares about itself; read by replay (scheduling, evidence), serve and the CLI.

    `overrides` names the path keys a run-wide option may set on every path of this engine (`--numerics` sets
    `numerics`); the engine's own `parse_options` validates the value, as for a key written in paths.toml.
    """

    sees_logits: bool = False  # results carry token ids and top-1 minus top-2 margins from the model's logits
    decodes_tokens: bool = False  # `decode_tokens` turns token ids into text (divergence evidence, logprobs)
    holds_together: bool = True  # False: two instances must not be loaded at once (vLLM's workers, GPU memory)
    in_process: bool = False  # the model runs in this process: `toolaudit serve` can host the path
    overrides: frozenset[str] = frozenset()


@dataclass(frozen=True)
class EngineRequest:
    """One recorded model call to replay: its key (for matching results), chat messages and tool definitions.

    `messages` and `tools` are OpenAI Chat Completions shapes (tools as `{"type": "function", "function": ...}`
    or bare function objects); engines render them into whatever their model needs.
    `sample` is which of a call's samples this request is (a sampled replay sends each call N times, as
    consecutive requests with the same key and samples 0..N-1): engines seed it with
    `completion.row_seed(path.seed, key, sample)` and may decode a call's samples together (shared prompt KV,
    or one request with `n`), as long as each result stays the draw of its own seed.
    """

    key: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    sample: int = 0
    logprobs: int = 0  # > 0: the result carries each step's top-`logprobs` log-probabilities (`top_logprobs`)


@dataclass
class EngineResult:
    """One completion and what it cost, plus the evidence needed to explain a divergence.

    `text` is the completion as a tool-call parser should see it: it includes the assistant prefill when one was
    used (the prefill is part of the model's answer even though the model did not generate it).
    `margins[i]` is top-1 minus top-2 logit of the distribution that chose generated token i, on the path that
    generated it, and `top2[i]` the two token ids: near-ties (tiny margins) point at numerics, large margins at
    a bug. Both are empty for engines that cannot see logits.
    `top_logprobs[i]`, only for requests that asked (`EngineRequest.logprobs = k`), is the step's top-k
    (token, log-probability) pairs, most likely first, exactly as the engine computed or returned them: token ids
    from in-process engines, token strings from an endpoint; empty where the engine gives none (an endpoint with
    logprobs disabled). The probe fingerprint (`replay.probe`) hashes them.
    `tokens` holds the generated tokens as strings, for engines that see token text but not ids (an HTTP endpoint
    returning logprobs); `replay.first_divergence` compares them when `token_ids` are missing.
    """

    key: str
    text: str = ""
    token_ids: list[int] = field(default_factory=list)  # generated tokens only (no prompt, no prefill)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0  # from the start of the batch that held this request until this request finished
    ttft_s: float = 0.0  # from the start of that batch until this request's first generated token was known
    drafted_tokens: int = 0  # speculative proposals verified by the target
    accepted_tokens: int = 0  # proposals the target kept
    forward_passes: int = 0  # target forward passes this request took part in (prefill included)
    margins: list[float] = field(default_factory=list)
    top2: list[tuple[int, int]] = field(default_factory=list)
    top_logprobs: list[list[tuple[int | str, float]]] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)  # generated token strings, when ids are not known
    error: str | None = None
    message: dict[str, Any] | None = None  # OpenAI-shaped assistant message, for engines that return tool calls
    system_fingerprint: str | None = None
    finish_reason: str | None = None  # "stop" (EOS or stop string), "length" (max_tokens), None on error
    # how an HTTP engine asked for this sample of a sampled call: "n" (choice `sample` of one request with n
    # choices) or "seed" (a request of its own, seeded per sample); None for in-process engines and greedy paths
    samples_via: str | None = None
    # Seconds of prefill another decode path in this process ran for this request's prompt and this path reused
    # (the embedded engine's shared prefix cache, `PathPrefix`): part of the time this path is charged
    # (`charged_seconds`), so that each path pays its own prompts' prefill once, whichever path ran first.
    reused_prefill_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted over drafted proposals; None when nothing was drafted (target-only paths)."""
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else None


def charged_seconds(wall: float, results: list[EngineResult]) -> float:
    """The time a path is charged for one engine call: its wall time plus the prefill it reused from other
    paths (`EngineResult.reused_prefill_s`). Its tokens/s is tokens over this (`analysis.speed`)."""
    return wall + sum(r.reused_prefill_s for r in results)


def error_result(key: str, error: BaseException | str) -> EngineResult:
    """The row that stands in for a request an engine could not serve."""
    message = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    return EngineResult(key=key, error=message)


class Engine(ABC):
    """One decode path. Subclasses set `name` (the `engine = "..."` value they serve) and `capabilities`, and
    implement `generate` and `path_components`; those holding resources implement `_load` and `_release`,
    which the base calls once each (`load` and `close` are idempotent). Use as a context manager to close.

    Built-ins: `torch.engine.TorchEngine`, `hf.engine.HFEngine`, `vllm.engine.VLLMEngine` (in process, on the
    `local.LocalEngine` skeleton) and `openai.engine.OpenAIEngine` (HTTP). Plug-ins subclass this class too.
    """

    name: ClassVar[str]
    capabilities: ClassVar[Capabilities] = Capabilities()

    def __init__(self, path) -> None:
        if path.engine != self.name:
            raise ConfigError(f"paths.{path.name}: engine {path.engine!r} is not the {self.name} engine")
        self.path = path
        self._loaded = False

    # -- lifecycle ----------------------------------------------------------------------------------------
    @property
    def loaded(self) -> bool:
        return self._loaded

    def load(self) -> None:
        """Load models, start workers or clients. Idempotent; `generate` calls it too. Raises on failure."""
        if not self._loaded:
            self._load()
            self._loaded = True

    def close(self) -> None:
        """Free what `load` took (models, worker processes, connections). Idempotent; the engine stays usable
        and loads again on next use."""
        if self._loaded:
            self._loaded = False
            self._release()

    def _load(self) -> None:
        """Acquire resources (called once per `load` after a `close`). Nothing, for engines that hold none."""
        return

    def _release(self) -> None:
        """Release what `_load` acquired."""
        return

    def check(self) -> None:
        """Cheap checks that need no load (model files exist, options agree); raises `ConfigError`."""
        return

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- work ---------------------------------------------------------------------------------------------
    @property
    def rows_in_flight(self) -> int:
        """Requests this path decodes together: a replay hands it at least this many per call (its chunk), so
        its batch stays full. The path's `batch_size` unless the engine sizes batches itself (torch on CUDA)."""
        return self.path.batch_size

    @abstractmethod
    def generate(self, requests: list[EngineRequest]) -> list[EngineResult]:
        """One result per request, in order. Never raises for a single bad request: it becomes `error`."""

    def decode_tokens(self, ids: list[int], keep_special: bool = False) -> str:
        """Token ids as text (special tokens dropped unless `keep_special`). Only for engines whose
        `capabilities.decodes_tokens` is true."""
        raise NotImplementedError(f"the {self.name} engine cannot decode token ids "
                                  "(capabilities.decodes_tokens is false)")

    # -- identity -----------------------------------------------------------------------------------------
    def fingerprint_components(self) -> dict[str, Any]:
        """Everything that defines this path (engine, versions, model identity, spec config, dtype, device):
        the engine's name and its `path_components`. Needs no loaded model."""
        return {"engine": self.name, **self.path_components()}

    @abstractmethod
    def path_components(self) -> dict[str, Any]:
        """What defines this path on this engine, as JSON-ready values (the fingerprint hashes them)."""
