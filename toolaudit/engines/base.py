"""What every engine takes and returns, so replay code never cares which engine produced a completion.

An engine turns recorded requests into completions on one decode path. The contract that keeps a replay of
thousands of calls going: one `EngineResult` per request, in request order, and a failure of one request is
that result's `error`, never an exception that loses the rest of the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class EngineRequest:
    """One recorded model call to replay: its key (for matching results), chat messages and tool definitions.

    `messages` and `tools` are OpenAI Chat Completions shapes (tools as `{"type": "function", "function": ...}`
    or bare function objects); engines render them into whatever their model needs.
    """

    key: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class EngineResult:
    """One completion and what it cost, plus the evidence needed to explain a divergence.

    `text` is the completion as a tool-call parser should see it: it includes the assistant prefill when one was
    used (the prefill is part of the model's answer even though the model did not generate it).
    `margins[i]` is top-1 minus top-2 logit of the distribution that chose generated token i, on the path that
    generated it, and `top2[i]` the two token ids: near-ties (tiny margins) point at numerics, large margins at
    a bug. Both are empty for engines that cannot see logits.
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
    tokens: list[str] = field(default_factory=list)  # generated token strings, when ids are not known
    error: str | None = None
    message: dict[str, Any] | None = None  # OpenAI-shaped assistant message, for engines that return tool calls
    system_fingerprint: str | None = None
    finish_reason: str | None = None  # "stop" (EOS or stop string), "length" (max_tokens), None on error

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted over drafted proposals; None when nothing was drafted (target-only paths)."""
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else None


@runtime_checkable
class Engine(Protocol):
    """A decode path that can replay requests. Implementations: `TorchEngine` (embedded), `OpenAIEngine` (HTTP)."""

    def generate(self, requests: list[EngineRequest]) -> list[EngineResult]:
        """One result per request, in order. Never raises for a single bad request: it becomes `error`."""
        ...

    def fingerprint_components(self) -> dict[str, Any]:
        """Everything that defines this path (engine, versions, model identity, spec config, dtype, device)."""
        ...


def error_result(key: str, error: BaseException | str) -> EngineResult:
    """The row that stands in for a request an engine could not serve."""
    message = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    return EngineResult(key=key, error=message)
