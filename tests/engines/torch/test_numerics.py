"""Emulated bf16/fp16 numerics (`toolaudit/engines/torch/numerics.py`) on tiny random Llamas: every tensor the
emulation says it rounds is exactly representable in the low dtype, elementwise ops equal native bf16 bit for
bit, fp16 stays finite, and `numerics = auto | native | emulated` selects and validates as documented."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from helpers import tiny_llama  # noqa: E402

from toolaudit import ConfigError  # noqa: E402
from toolaudit.engines.paths import PathConfig, parse_path  # noqa: E402
from toolaudit.engines.torch import gemm, numerics  # noqa: E402
from toolaudit.engines.torch.attention import use_grouped_attention  # noqa: E402
from toolaudit.engines.torch.loop import DecodeSettings, decode  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def representable(t: torch.Tensor, dtype: torch.dtype) -> bool:
    return torch.equal(t, t.to(dtype).to(t.dtype))


def emulated_tiny(dtype: torch.dtype, seed: int = 0):
    """A tiny Llama loaded as a native `dtype` path would be, then emulating it (what `load_model` does)."""
    model = tiny_llama(seed, float64=False).to(dtype).eval()
    use_grouped_attention(model)
    return numerics.emulate(model, dtype)


def native_tiny(dtype: torch.dtype, seed: int = 0):
    model = tiny_llama(seed, float64=False).to(dtype).eval()
    use_grouped_attention(model)
    return model


def prompts(n: int = 3) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    # lengths 40, 29, 7: prefill on both attention paths (long queries: flash-style; short: matmul path)
    return [torch.randint(3, 300, (length,), generator=g).tolist() for length in (40, 29, 7)][:n]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_emulation_rounds_where_it_says(dtype):
    model = emulated_tiny(dtype)
    assert numerics.emulated_dtype(model) is dtype
    for p in model.parameters():
        assert p.dtype == torch.float32 and representable(p, dtype)
    seen: dict[str, int] = {}

    def check(name):
        def hook(module, args, output=None):
            tensors = [output if output is not None else args[0]]
            if isinstance(tensors[0], tuple):
                tensors = list(tensors[0])
            for t in tensors:
                assert t.dtype == torch.float32 and representable(t, dtype), name
            seen[name] = seen.get(name, 0) + 1
        return hook

    base = model.model
    base.embed_tokens.register_forward_hook(check("embedding"))
    base.rotary_emb.register_forward_hook(check("rotary cos/sin"))
    base.norm.register_forward_hook(check("final norm"))
    model.lm_head.register_forward_hook(check("logits"))
    for layer in base.layers:
        layer.input_layernorm.register_forward_hook(check("norm"))
        layer.post_attention_layernorm.register_forward_pre_hook(check("residual after attention"))
        layer.post_attention_layernorm.register_forward_hook(check("norm"))
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            getattr(layer.self_attn, proj).register_forward_hook(check(proj))
        layer.self_attn.o_proj.register_forward_pre_hook(check("attention output"))
        for proj in ("gate_proj", "up_proj", "down_proj"):
            getattr(layer.mlp, proj).register_forward_hook(check(proj))
        layer.mlp.act_fn.register_forward_hook(check("silu"))
        layer.mlp.down_proj.register_forward_pre_hook(check("silu x up"))
        layer.register_forward_hook(check("residual after mlp"))
    # Speculative decoding at batch 3: prefill (both attention paths), joins, verification passes, rollback.
    from toolaudit.engines.torch.kv import KVBatch
    from toolaudit.engines.torch.proposers import NgramProposer

    outputs = decode(model, prompts(), DecodeSettings(max_tokens=12), NgramProposer(3, 1, 2), batch_size=2)
    assert all(len(o.token_ids) == 12 for o in outputs)
    assert len(seen) == 17 and min(seen.values()) >= 6
    kv = KVBatch(model)
    logits = kv.admit(prompts(2))
    kv.extend([[5, 6, 7], [8, 9, 10]])
    assert representable(logits, dtype)
    for layer in kv.cache.layers:
        keys, values = layer.full()
        assert representable(keys, dtype) and representable(values, dtype)


def test_elementwise_ops_equal_native_bf16_bit_for_bit():
    """Norms, SiLU, RoPE, residual sums: no reduction order involved, so emulated == native exactly; the
    first attention output of a decode step equals native too (its matmuls are tiny)."""
    native, emulated = native_tiny(torch.bfloat16), emulated_tiny(torch.bfloat16)
    x = torch.randn(3, 5, 64).bfloat16()
    with torch.inference_mode():
        for a, b in zip(native.modules(), emulated.modules()):
            if type(a).__name__ == "LlamaRMSNorm":
                assert torch.equal(a(x).float(), b(x.float()))
        act = native.model.layers[0].mlp.act_fn
        assert torch.equal(act(x).float(), emulated.model.layers[0].mlp.act_fn(x.float()))
    captured = {}
    for name, model in (("native", native), ("emulated", emulated)):
        layer = model.model.layers[0]
        layer.self_attn.o_proj.register_forward_pre_hook(
            lambda m, args, name=name: captured.setdefault(name, []).append(args[0].float()))
        decode(model, [prompts(3)[2]], DecodeSettings(max_tokens=3))
    for a, b in zip(captured["native"], captured["emulated"]):  # prefill of 7 tokens (short path), then steps
        assert float((a == b).float().mean()) > 0.95  # matmul sums may round differently, rarely


def test_float16_emulation_is_finite_and_close_to_float32():
    emulated = emulated_tiny(torch.float16)
    reference = tiny_llama(0, float64=False).eval()
    use_grouped_attention(reference)
    from toolaudit.engines.torch.kv import KVBatch

    with torch.inference_mode():
        low, high = KVBatch(emulated).admit(prompts()), KVBatch(reference).admit(prompts())
    assert torch.isfinite(low).all()
    assert torch.allclose(low, high, atol=0.05, rtol=0.01)
    out = decode(emulated, prompts(), DecodeSettings(max_tokens=8))
    assert all(len(o.token_ids) == 8 and all(m == m for m in o.margins) for o in out)


def test_emulate_refuses_what_it_cannot_emulate():
    model = tiny_llama(0, float64=False).eval()
    with pytest.raises(ValueError, match="use_grouped_attention"):
        numerics.emulate(model.to(torch.bfloat16), torch.bfloat16)
    use_grouped_attention(model)
    with pytest.raises(ValueError, match="loaded in"):
        numerics.emulate(model.to(torch.float32), torch.bfloat16)
    numerics.emulate(model.to(torch.bfloat16), torch.bfloat16)
    with pytest.raises(ValueError, match="already"):
        numerics.emulate(model, torch.bfloat16)


def test_float32_models_are_untouched_by_the_rope_wrapper():
    """The RoPE wrapper installed by emulation passes other models straight through (float64: bit-exact)."""
    emulated_tiny(torch.bfloat16)  # installs the wrapper
    from transformers.models.llama import modeling_llama

    assert getattr(modeling_llama.apply_rotary_pos_emb, numerics.ROUND_TO, False)
    q, k = torch.randn(1, 2, 4, 16, dtype=torch.float64), torch.randn(1, 1, 4, 16, dtype=torch.float64)
    cos, sin = torch.randn(1, 4, 16, dtype=torch.float64), torch.randn(1, 4, 16, dtype=torch.float64)
    got = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)
    half = lambda x: torch.cat((-x[..., 8:], x[..., :8]), dim=-1)  # noqa: E731
    assert torch.equal(got[0], q * cos[:, None] + half(q) * sin[:, None])
    assert torch.equal(got[1], k * cos[:, None] + half(k) * sin[:, None])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
def test_rope_in_one_pass_gives_the_three_roundings_bits(dtype, unsqueeze_dim):
    """`_rounded_rope` (q and k together, rotate_half(x) * sin as x rolled times sin half-negated) equals eager
    native RoPE's three roundings, q*cos, rotate_half(q)*sin and their sum, bit for bit, in either layout (heads
    on axis 1 or 2), with 9 query and 3 key heads; its outputs say they are rounded, so nothing rounds them again."""
    from transformers.models.llama.modeling_llama import rotate_half

    torch.manual_seed(0)
    heads_axis = unsqueeze_dim
    shape = lambda h: (4, h, 5, 64) if heads_axis == 1 else (4, 5, h, 64)  # noqa: E731
    q, k = (numerics.round_to(torch.randn(*shape(h)) * 3, dtype) for h in (9, 3))
    cos, sin = (numerics.round_to(torch.randn(4, 5, 64), dtype) for _ in range(2))
    r = lambda t: numerics.round_to(t, dtype)  # noqa: E731
    c, s_ = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    got = numerics._rounded_rope(q, k, cos, sin, dtype, unsqueeze_dim)
    for out, x in zip(got, (q, k)):
        assert torch.equal(out, r(r(x * c) + r(rotate_half(x) * s_)))
        assert numerics.rounded(out, dtype) is out
    assert numerics.rounded(q, dtype) is not q  # an unmarked tensor is rounded (a copy)


# ---------------------------------------------------------------------------------------------- selection

@pytest.mark.parametrize(("flags", "dtype", "device", "requested", "expected"), [
    ({"avx2", "avx512f", "avx512_bf16"}, "bfloat16", "cpu", "auto", "native"),
    ({"avx2", "amx_bf16"}, "bfloat16", "cpu", "auto", "native"),
    ({"avx2", "fma"}, "bfloat16", "cpu", "auto", "emulated"),
    ({"avx2", "avx512_bf16"}, "float16", "cpu", "auto", "emulated"),  # bf16 hardware does not make fp16 fast
    ({"avx2", "avx512_fp16"}, "float16", "cpu", "auto", "native"),
    ({"avx2"}, "bfloat16", "cuda", "auto", "native"),
    ({"avx2"}, "bfloat16", "cpu", "native", "native"),
    ({"avx512_bf16"}, "bfloat16", "cpu", "emulated", "emulated"),
    ({"avx2"}, "float32", "cpu", "auto", "native"),
    ({"avx2"}, "float64", "cpu", "native", "native"),
])
def test_numerics_selection(monkeypatch, flags, dtype, device, requested, expected):
    monkeypatch.setattr(numerics, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.setattr(numerics, "onednn_supports", lambda dtype: True)
    assert numerics.resolve(dtype, device, requested) == expected


def test_a_process_limited_to_avx2_emulates_whatever_the_flags_say(monkeypatch):
    """oneDNN limited to AVX2 (`ONEDNN_MAX_CPU_ISA=AVX2`, as the suite runs like an AVX2-only machine) cannot
    multiply bf16 even on a CPU that lists avx512_bf16: auto emulates, and the capability names no bf16 flag."""
    monkeypatch.setattr(numerics, "cpu_flags", lambda: frozenset({"avx2", "avx512f", "avx512_bf16"}))
    monkeypatch.setattr(numerics, "onednn_supports", lambda dtype: False)
    assert numerics.resolve("bfloat16", "cpu", "auto") == "emulated"
    assert "avx512_bf16" not in numerics.cpu_capability()
    monkeypatch.setattr(numerics, "onednn_supports", lambda dtype: True)
    assert numerics.resolve("bfloat16", "cpu", "auto") == "native"
    assert numerics.cpu_capability().endswith("+avx512_bf16")


def test_engine_resolves_numerics_and_reports_it(monkeypatch, tiny_model_dir):
    from toolaudit.engines import make_engine

    model = str(tiny_model_dir)
    monkeypatch.setattr(numerics, "cpu_flags", lambda: frozenset({"avx2"}))
    engine = make_engine(parse_path("p", {"model": model, "numerics": "auto", "threads": 1}))
    components = engine.fingerprint_components()
    assert components["numerics"] == engine.numerics == "emulated"
    assert components["torch_threads"] == 1 and components["cpu_capability"].startswith(
        torch.backends.cpu.get_cpu_capability())
    monkeypatch.setattr(numerics, "cpu_flags", lambda: frozenset({"avx2", "amx_bf16"}))
    monkeypatch.setattr(numerics, "onednn_supports", lambda dtype: True)
    assert engine.numerics == "native" and numerics.cpu_capability().endswith("+amx_bf16")
    assert make_engine(PathConfig(name="q", model=model, dtype="float32")).numerics == "native"
    bad = make_engine(PathConfig(name="q", model=model, dtype="float32", options={"numerics": "emulated"}))
    with pytest.raises(ConfigError, match=r"paths\.q: numerics 'emulated' applies to bfloat16 and float16"):
        bad.fingerprint_components()


@pytest.mark.parametrize(("table", "message"), [
    ({"numerics": "fast"}, "paths.p: numerics must be one of auto, native, emulated (got 'fast')"),
    ({"numerics": "emulated", "dtype": "float32"}, "paths.p: numerics 'emulated' applies to bfloat16 and float16"),
    ({"threads": 0}, "paths.p: threads must be a positive integer (got 0)"),
    ({"threads": True}, "paths.p: threads must be a positive integer (got True)"),
    ({"threads": "2"}, "paths.p: threads must be a positive integer (got '2')"),
])
def test_key_validation_names_path_and_key(table, message):
    with pytest.raises(ConfigError) as info:
        parse_path("p", table)
    assert message in str(info.value)


def test_options_hold_only_the_keys_given(tmp_path):
    from toolaudit.engines.paths import load_paths

    assert parse_path("p", {}).options == {}
    assert parse_path("p", {"numerics": "emulated", "threads": 2}).options == {"numerics": "emulated", "threads": 2}
    file = tmp_path / "paths.toml"
    file.write_text('[paths.fast]\ndtype = "float16"\nnumerics = "native"\nthreads = 1\n')
    assert load_paths(file)["fast"].options == {"numerics": "native", "threads": 1}
    file.write_text('[paths.fast]\nnumerics = "yes"\n')
    with pytest.raises(ConfigError, match=r"paths\.toml: paths\.fast: numerics must be one of"):
        load_paths(file)


def test_models_are_cached_per_numerics(tiny_model_dir):
    from toolaudit.engines.torch.models import load_model

    native, _ = load_model(str(tiny_model_dir), "bfloat16", "cpu", "native")
    emulated, _ = load_model(str(tiny_model_dir), "bfloat16", "cpu", "emulated")
    assert native is not emulated and native is load_model(str(tiny_model_dir), "bfloat16", "cpu", "native")[0]
    assert next(native.parameters()).dtype == torch.bfloat16
    assert next(emulated.parameters()).dtype == torch.float32 and numerics.emulated_dtype(emulated) is torch.bfloat16
    for a, b in zip(native.parameters(), emulated.parameters()):
        assert torch.equal(a.float(), b)  # the same weights, bit for bit
    with pytest.raises(ValueError, match="numerics must be resolved"):
        load_model(str(tiny_model_dir), "bfloat16", "cpu", "auto")


def test_engine_runs_emulated_paths_and_sets_threads(tiny_model_dir):
    from toolaudit.engines.base import EngineRequest
    from toolaudit.engines.paths import PromptConfig, SpeculativeConfig
    from toolaudit.engines.torch.engine import TorchEngine

    requests = [EngineRequest(key=f"k{i}", messages=[{"role": "user", "content": "price of AMZN " * (i + 1)}])
                for i in range(3)]
    common = dict(model=str(tiny_model_dir), dtype="bfloat16", batch_size=2, max_tokens=8,
                  prompt=PromptConfig(few_shot=0), options={"numerics": "emulated", "threads": 1})
    target = TorchEngine(PathConfig(name="t", **common))
    spec = TorchEngine(PathConfig(name="s", speculative=SpeculativeConfig(method="ngram"), **common))
    torch.set_num_threads(2)
    results = target.generate(requests) + spec.generate(requests)
    assert torch.get_num_threads() == 1
    assert all(r.error is None and 0 < len(r.token_ids) <= 8 for r in results), [r.error for r in results]
    assert target._model is spec._model and numerics.emulated_dtype(target._model) is torch.bfloat16


def test_flash_attention_of_emulated_prefill_is_exact_attention():
    """Without rounding, in float64, the block-by-block softmax of emulated prefill equals attention computed
    directly: after a cached prefix (queries are the last rows), across several key blocks and query blocks
    (each query block stops at the last key it sees)."""
    from toolaudit.engines.torch.attention import KV_BLOCK, Q_BLOCK, _causal, _flash_rounded

    g = torch.Generator().manual_seed(3)
    q_len, total = 2 * Q_BLOCK + 40, KV_BLOCK + 300
    query = torch.randn(2, 4, q_len, 16, generator=g, dtype=torch.float64)
    key, value = (torch.randn(2, 2, total, 16, generator=g, dtype=torch.float64) for _ in range(2))
    mask = _causal(q_len, total, "cpu").expand(2, 1, q_len, total).clone()
    mask[1, :, :, :7] = False  # a row with left padding
    got = _flash_rounded(query, key, value, mask, 0.25, lambda t: t)
    expected = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=0.25,
                                                                enable_gqa=True)
    assert torch.allclose(got, expected, atol=1e-12)


@pytest.mark.skipif(not gemm.prepacking_available(), reason="this torch build has no oneDNN prepacked linear")
def test_prepacked_linears_keep_the_rounding_and_the_values(tiny_model_dir):
    """`load_model` puts an emulated model's linears on prepacked oneDNN weights: every Linear output is still
    rounded to bf16, logits stay within float32 summation-order noise of MKL's, and the fingerprint says so."""
    from toolaudit.engines import make_engine
    from toolaudit.engines.torch.models import load_model

    packed, _ = load_model(str(tiny_model_dir), "bfloat16", "cpu", "emulated")
    linears = [m for m in packed.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all("forward" in vars(m) for m in linears)  # each routed through its packed weight
    plain = emulated_tiny(torch.bfloat16)  # the same weights on torch's default kernels
    plain.load_state_dict(packed.state_dict())
    seen = []
    handle = packed.lm_head.register_forward_hook(lambda m, a, out: seen.append(representable(out, torch.bfloat16)))
    ids = torch.tensor([prompts(1)[0]])
    with torch.inference_mode():
        got, want = packed(input_ids=ids).logits, plain(input_ids=ids).logits
    handle.remove()
    assert seen == [True]
    assert got.argmax(-1).eq(want.argmax(-1)).float().mean() > 0.9 and (got - want).abs().max() < 0.5
    engine = make_engine(parse_path("p", {"model": str(tiny_model_dir), "numerics": "emulated"}))
    assert engine.fingerprint_components()["gemm"] == gemm.PREPACKED
    float32 = make_engine(parse_path("p", {"model": str(tiny_model_dir), "dtype": "float32"}))
    assert float32.fingerprint_components()["gemm"] == gemm.PREPACKED
    float64 = make_engine(parse_path("p", {"model": str(tiny_model_dir), "dtype": "float64"}))
    assert "gemm" not in float64.fingerprint_components()  # oneDNN has no float64 linear: torch's default


@pytest.mark.skipif(not gemm.prepacking_available(), reason="this torch build has no oneDNN prepacked linear")
def test_float32_prepacked_linears_differ_from_mkl_only_in_summation_order(tiny_model_dir):
    """float32 models run prepacked linears too: the logits stay within float32 rounding of torch's default
    (MKL) product, so float32 remains the exactness reference against HF `generate()` and vLLM."""
    from transformers import AutoModelForCausalLM

    from toolaudit.engines.torch.models import load_model

    packed, _ = load_model(str(tiny_model_dir), "float32", "cpu", "native")
    assert all("forward" in vars(m) for m in packed.modules() if isinstance(m, torch.nn.Linear))
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([prompts(1)[0]])
    with torch.inference_mode():
        got, want = packed(input_ids=ids).logits, plain(input_ids=ids).logits
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    assert (got - want).abs().max() < 1e-4 * want.abs().max()


@pytest.mark.skipif(not (gemm.prepacking_available() and numerics.has_native("bfloat16", "cpu")),
                    reason="prepacked bf16 linears need oneDNN and a CPU with native bf16 matmul")
def test_native_bf16_linears_are_prepacked_with_the_same_results(tiny_model_dir):
    """Native bf16 CPU models run prepacked oneDNN linears: the same oneDNN bf16 product without a per-call
    weight reorder, so the logits match the default kernel's (bit for bit on the CPUs measured)."""
    from toolaudit.engines import make_engine
    from toolaudit.engines.torch.models import load_model

    packed, _ = load_model(str(tiny_model_dir), "bfloat16", "cpu", "native")
    assert all("forward" in vars(m) for m in packed.modules() if isinstance(m, torch.nn.Linear))
    plain = native_tiny(torch.bfloat16)
    plain.load_state_dict(packed.state_dict())
    ids = torch.tensor([prompts(1)[0]])
    with torch.inference_mode():
        got, want = packed(input_ids=ids).logits.float(), plain(input_ids=ids).logits.float()
    assert got.argmax(-1).eq(want.argmax(-1)).float().mean() > 0.9 and (got - want).abs().max() < 0.5
    native = make_engine(parse_path("p", {"model": str(tiny_model_dir), "numerics": "native"}))
    assert native.fingerprint_components()["gemm"] == gemm.PREPACKED


def test_which_paths_get_prepacked_linears(monkeypatch):
    """Emulated numerics, float32 and native bf16 on a CPU with bf16 matmul run prepacked linears; float64, forced
    native bf16 on a CPU without it (oneDNN refuses bf16 weights there) and CUDA keep torch's default."""
    monkeypatch.setattr(gemm, "prepacking_available", lambda: True)
    monkeypatch.setattr(numerics, "cpu_flags", lambda: frozenset({"avx2"}))
    monkeypatch.setattr(numerics, "onednn_supports", lambda dtype: True)
    assert gemm.kernel("emulated", "cpu", "bfloat16") == gemm.PREPACKED
    assert gemm.kernel("native", "cpu", "bfloat16") == gemm.DEFAULT
    assert gemm.kernel("native", "cpu", "float32") == gemm.PREPACKED
    assert gemm.kernel("native", "cpu", "float64") == gemm.DEFAULT
    monkeypatch.setattr(numerics, "cpu_flags", lambda: frozenset({"avx2", "avx512_bf16"}))
    assert gemm.kernel("native", "cpu", "bfloat16") == gemm.PREPACKED
    assert gemm.kernel("native", "cuda:0", "bfloat16") == gemm.DEFAULT
    monkeypatch.setattr(numerics, "onednn_supports", lambda dtype: False)  # e.g. ONEDNN_MAX_CPU_ISA=AVX2
    assert gemm.kernel("native", "cpu", "bfloat16") == gemm.DEFAULT
    monkeypatch.setattr(gemm, "prepacking_available", lambda: False)
    assert gemm.kernel("emulated", "cpu", "bfloat16") == gemm.DEFAULT


def test_emulated_decode_attention_adds_the_split_parts_before_rounding():
    """A split cache's two value products are added in float32 before the output's one bf16 rounding (as
    flash-decoding combines float32 partials), so an emulated decode step gives the same output wherever the
    split between base and recent columns falls, up to float32 summation order. A native bf16 model's products
    come out rounded, so its output depends on the split (why `kv` folds a native cache on admission)."""
    from types import SimpleNamespace

    from toolaudit.engines.torch.attention import BASE, grouped_attention, split_in_numerics

    torch.manual_seed(0)
    dtype = torch.bfloat16
    query = numerics.round_to(torch.randn(4, 9, 1, 64), dtype)
    keys, values = (numerics.round_to(torch.randn(4, 3, 300, 64), dtype) for _ in range(2))

    def attend(module, split: int, as_dtype: torch.dtype) -> torch.Tensor:
        k, v = keys.to(as_dtype), values.to(as_dtype)
        recent_keys, recent_values = k[:, :, split:].contiguous(), v[:, :, split:].contiguous()
        if split:
            setattr(recent_keys, BASE, (k[:, :, :split].contiguous(), v[:, :, :split].contiguous()))
        return grouped_attention(module, query.to(as_dtype), recent_keys, recent_values, None, scaling=0.125)[0]

    emulating, native = SimpleNamespace(**{numerics.ROUND_TO: dtype}), SimpleNamespace()
    assert not split_in_numerics(keys) and split_in_numerics(keys.to(dtype))
    for split in (100, 296):
        assert (attend(emulating, split, torch.float32) != attend(emulating, 0, torch.float32)).float().mean() < 0.01
        assert (attend(native, split, dtype) != attend(native, 0, dtype)).float().mean() > 0.2


def test_the_avx2_variables_make_this_cpu_run_as_an_avx2_only_one():
    """`make test-avx2`'s variables (ATen, MKL and oneDNN capped at AVX2), in a process started with them: torch
    reports AVX2, oneDNN has no bf16 math, `auto` bf16 numerics emulates and the capability names no bf16 flag,
    whatever this CPU is: what an AVX2-only CI machine does, on a developer's AVX512-BF16 or AMX machine."""
    import subprocess
    import sys

    code = ("import torch; from toolaudit.engines.torch import numerics as n; "
            "print(torch.backends.cpu.get_cpu_capability(), torch.ops.mkldnn._is_mkldnn_bf16_supported(), "
            "n.resolve('bfloat16', 'cpu'), n.cpu_capability())")
    env = dict(os.environ, ATEN_CPU_CAPABILITY="avx2", MKL_ENABLE_INSTRUCTIONS="AVX2", ONEDNN_MAX_CPU_ISA="AVX2")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["AVX2", "False", "emulated", "AVX2"]
