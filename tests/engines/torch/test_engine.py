"""The torch engine on a tiny float64 model: results in request order, a request too long for the model is an
error row, n-gram speculation equals target greedy, and the fingerprint is JSON-ready."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from toolaudit.engines.base import EngineRequest  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def test_engine_results_in_order_with_errors_as_rows(tiny_model_dir):
    from toolaudit.engines.paths import PathConfig, PromptConfig, SpeculativeConfig
    from toolaudit.engines.torch.engine import TorchEngine

    tools = [{"type": "function", "function": {"name": "get_quote", "parameters": {"type": "object"}}}]
    requests = [
        EngineRequest(key=f"k{i}", messages=[{"role": "user", "content": "price of AMZN " * (i + 1)}], tools=tools)
        for i in range(4)
    ]
    requests.insert(2, EngineRequest(key="bad", messages=[{"role": "user", "content": "x" * 1200}], tools=tools))
    common = dict(model=str(tiny_model_dir), dtype="float64", batch_size=3, max_tokens=12, options={"threads": 1},
                  prompt=PromptConfig(few_shot=1, prefill="<tool_call>\n"))
    target = TorchEngine(PathConfig(name="target", **common))
    spec = TorchEngine(PathConfig(name="spec", speculative=SpeculativeConfig(method="ngram", num_speculative_tokens=4),
                                  **common))
    a, b = target.generate(requests), spec.generate(requests)
    assert [r.key for r in a] == [r.key for r in requests] == [r.key for r in b]
    assert "exceeds the model's 1024 positions" in a[2].error and a[2].text == ""
    for x, y in zip(a, b):
        if x.key != "bad":
            assert x.error is None and x.token_ids == y.token_ids and x.text == y.text
            assert x.text.startswith("<tool_call>\n") and x.completion_tokens == len(x.token_ids) > 0
            assert x.prompt_tokens > 0 and 0 < x.ttft_s <= x.latency_s
    assert sum(r.drafted_tokens for r in b) > 0
    components = spec.fingerprint_components()
    assert components["speculative"]["method"] == "ngram" and components["dtype"] == "float64"
    assert len(components["model_identity"]) == 16
    json.dumps(components)


def test_malloc_tuning_is_applied_once_and_can_be_turned_off(monkeypatch):
    """`keep_freed_memory` sets glibc's thresholds (True) on glibc Linux, and does nothing when turned off."""
    import platform

    from toolaudit.engines.torch.engine import keep_freed_memory

    tune = keep_freed_memory.__wrapped__  # the cached one runs once per process
    monkeypatch.setenv("TOOLAUDIT_MALLOC_TUNING", "0")
    assert tune() is False
    monkeypatch.delenv("TOOLAUDIT_MALLOC_TUNING")
    assert tune() is (platform.libc_ver()[0] == "glibc")


def test_fingerprint_names_no_momentary_load(monkeypatch, tiny_model_dir):
    """The thread count follows the load (`threads.choose`); the fingerprint names the configured count, or the
    cores the process may use, so a resumed or sharded run on a busier machine is the same path."""
    from toolaudit.engines import threads
    from toolaudit.engines.paths import PathConfig
    from toolaudit.engines.torch.engine import TorchEngine

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "_allowed", lambda: {0, 1})
    seen = {}
    for busy in (0.0, 1.0, 2.0):
        monkeypatch.setattr(threads, "measure_busy", lambda cores, busy=busy: busy)
        threads._last.clear()
        engine = TorchEngine(PathConfig(name="p", model=str(tiny_model_dir), dtype="float32"))
        seen[busy] = (engine.threads, json.dumps(engine.fingerprint_components(), sort_keys=True))
    threads._last.clear()
    assert [t for t, _ in seen.values()] == [2, 1, 1]
    assert len({fp for _, fp in seen.values()}) == 1
    assert f'"torch_threads": {threads.available_cores()}' in seen[0.0][1]
    pinned = TorchEngine(PathConfig(name="p", model=str(tiny_model_dir), dtype="float32", options={"threads": 1}))
    assert pinned.fingerprint_components()["torch_threads"] == 1 == pinned.threads
