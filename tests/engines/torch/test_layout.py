"""Decoding layouts of torch paths (`layout.py`, keys `kv_cache`, `cuda_graphs`, `max_batch`): defaults by device,
errors that name the key, fingerprints that keep CPU defaults unchanged, and the static cache behind the engine
giving the growing cache's tokens (float64 tiny model)."""

from __future__ import annotations

import pytest

from toolaudit import ConfigError
from toolaudit.engines.torch.config import TorchOptions
from toolaudit.engines.torch.layout import MAX_AUTO_BATCH, SIZING_COLUMNS
from toolaudit.engines.torch.layout import resolve_layout as resolve_typed


def resolve_layout(options: dict, *args, **kwargs):
    """A path's keys as paths.toml gives them, typed as the engine reads them."""
    return resolve_typed(TorchOptions(**options), *args, **kwargs)


def test_cpu_defaults_keep_the_growing_cache_and_earlier_fingerprints():
    layout = resolve_layout({}, "cpu", batch_size=16)
    assert (layout.kv_cache, layout.fixed_shapes, layout.cuda_graphs, layout.rows) == ("dynamic", False, False, 16)
    assert layout.components("cpu") == {}
    static = resolve_layout({"kv_cache": "static"}, "cpu", batch_size=8)
    assert not static.fixed_shapes and static.components("cpu")["kv_cache"] == "static"


def test_cuda_defaults_static_graphs_and_rows_from_memory():
    per_token = 23_040  # SmolLM2-135M in bf16: 30 layers x 2 x 3 heads x 64 x 2 bytes
    layout = resolve_layout({}, "cuda", batch_size=16, kv_bytes_per_token=per_token, device_bytes=8 << 30)
    assert layout.kv_cache == "static" and layout.fixed_shapes and layout.cuda_graphs
    assert layout.rows == int((8 << 30) * 0.25) // (per_token * SIZING_COLUMNS) == 22
    big = resolve_layout({}, "cuda", batch_size=16, kv_bytes_per_token=per_token, device_bytes=80 << 30)
    assert big.rows == min(MAX_AUTO_BATCH, int((80 << 30) * 0.25) // (per_token * SIZING_COLUMNS))
    assert resolve_layout({"max_batch": 5}, "cuda", 16, per_token, 80 << 30).rows == 5
    eager = resolve_layout({"cuda_graphs": False}, "cuda:0", 16)
    assert eager.fixed_shapes and not eager.cuda_graphs and eager.rows == 16
    assert eager.components("cuda:0")["cuda_graphs"] is False


def test_compile_is_named_in_the_fingerprint_only_when_on():
    plain = resolve_layout({}, "cuda", 16)
    compiled = resolve_layout({"compile": True}, "cuda", 16)
    assert not plain.compiled and "compile" not in plain.components("cuda")
    assert compiled.compiled and compiled.components("cuda")["compile"] is True


@pytest.mark.parametrize("options, device, message", [
    ({"compile": True}, "cpu", "compile = true needs the fixed-shape step"),
    ({"compile": True, "kv_cache": "dynamic"}, "cuda", "compile = true needs the fixed-shape step"),
    ({"max_batch": 513}, "cuda", "max_batch 513 is more than the largest fixed-shape bucket"),
])
def test_layouts_the_fixed_step_cannot_run(options, device, message):
    """More rows than the largest bucket used to make slot allocation raise mid-replay (and the engine retried
    one request at a time): refused up front, naming the key."""
    with pytest.raises(ConfigError, match=message):
        resolve_layout(options, device, 16, name="p")
    assert resolve_layout({"max_batch": 513}, "cpu", 16).rows == 513  # the growing cache has no buckets


@pytest.mark.parametrize("options, message", [
    ({"cuda_graphs": True}, "needs a CUDA device"),
    ({"kv_cache": "dynamic", "cuda_graphs": True}, "needs a CUDA device"),
])
def test_impossible_layouts_name_the_key(options, message):
    with pytest.raises(ConfigError, match=message):
        resolve_layout(options, "cpu", 4, name="p")
    if options.get("kv_cache") == "dynamic":
        with pytest.raises(ConfigError, match='kv_cache = "static"'):
            resolve_layout(options, "cuda", 4, name="p")


@pytest.mark.parametrize("line, message", [
    ('kv_cache = "paged"', "kv_cache must be one of static, dynamic"),
    ("max_batch = 0", "max_batch must be a positive integer"),
    ('cuda_graphs = "yes"', "cuda_graphs must be true or false"),
    ("compile = 1", "compile must be true or false"),
])
def test_bad_keys_in_paths_toml(tmp_path, line, message):
    from toolaudit.engines.paths import load_paths

    file = tmp_path / "paths.toml"
    file.write_text(f'[paths.p]\nengine = "torch"\n{line}\n')
    with pytest.raises(ConfigError, match=message):
        load_paths(file)


def test_static_cache_in_the_engine_gives_the_growing_caches_tokens(tiny_model_dir):
    pytest.importorskip("torch")
    from toolaudit.engines.base import EngineRequest
    from toolaudit.engines.paths import PathConfig, PromptConfig, SpeculativeConfig
    from toolaudit.engines.torch.engine import TorchEngine

    tools = [{"type": "function", "function": {"name": "get_quote", "parameters": {"type": "object"}}}]
    requests = [EngineRequest(key=f"k{i}", messages=[{"role": "user", "content": "price of AMZN " * (i + 1)}],
                              tools=tools) for i in range(5)]
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=4)
    results = {}
    for kv_cache in ("dynamic", "static"):
        for speculative in (None, spec):
            engine = TorchEngine(PathConfig(name="p", model=str(tiny_model_dir), dtype="float64", batch_size=2,
                                            max_tokens=12, options={"threads": 1, "kv_cache": kv_cache},
                                            speculative=speculative, prompt=PromptConfig(few_shot=1)))
            results[kv_cache, speculative is not None] = engine.generate(requests)
            assert ("kv_cache" in engine.fingerprint_components()) == (kv_cache == "static")
    tokens = {key: [r.token_ids for r in rows] for key, rows in results.items()}
    assert all(r.error is None for rows in results.values() for r in rows)
    assert len({str(t) for t in tokens.values()}) == 1, tokens
