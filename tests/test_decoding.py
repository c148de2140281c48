"""Exactness of the decode loops on tiny random Llama models in float64.

In exact arithmetic speculative greedy decoding equals target greedy decoding, and speculative sampling has the
target's distribution. float64 is close enough to exact that these hold token for token, which is what lets
toolaudit attribute bf16 drift to numerics rather than to the loops.
"""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from toolaudit.engines.base import EngineRequest  # noqa: E402
from toolaudit.engines.decoding import (  # noqa: E402
    DecodeSettings,
    DraftModelProposer,
    KVBatch,
    NgramProposer,
    PrefixCache,
    check_draft_compatible,
    decode,
)
from toolaudit.engines.models import use_grouped_attention  # noqa: E402
from toolaudit.errors import ConfigError  # noqa: E402

VOCAB = 300


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matrices gain nothing from threads, and spinning threads suffer badly on a shared 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_llama(seed: int, vocab: int = VOCAB, head_scale: float = 1.0, base=None, noise: float = 0.0):
    """A 2-layer Llama; `base` + `noise` makes a draft that agrees with the target most of the time."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024,
    )
    model = transformers.LlamaForCausalLM(config).to(torch.float64).eval()
    with torch.no_grad():
        if base is not None:
            for p, q in zip(model.parameters(), base.parameters()):
                p.copy_(q + noise * torch.randn_like(q) * q.std().clamp_min(1e-3))
        else:
            model.lm_head.weight.mul_(head_scale)
    return model


@pytest.fixture(scope="module", params=["sdpa", "toolaudit"])
def target(request):
    """The target under transformers' sdpa attention and under the engine's own grouped attention."""
    model = tiny_llama(0)
    if request.param == "toolaudit":
        use_grouped_attention(model)
    return model


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(5)
    base = torch.randint(3, VOCAB, (12,), generator=g).tolist()
    # Repetitive prompts so that n-gram lookup finds proposals; ragged lengths exercise padding.
    return [base * 3, base[:7] * 4 + [5, 6], base[:5] * 5 + [9]]


SETTINGS = DecodeSettings(max_tokens=40)


def greedy(model, prompts, settings=SETTINGS):
    return [decode(model, [p], settings)[0].token_ids for p in prompts]


def test_batched_target_equals_one_at_a_time(target, prompts):
    batched = decode(target, prompts, SETTINGS)
    assert [o.token_ids for o in batched] == greedy(target, prompts)
    assert all(o.forward_passes == len(o.token_ids) for o in batched)  # one token per pass


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("kind", ["ngram", "draft_random", "draft_close", "draft_self"])
def test_speculative_greedy_equals_target_greedy(target, prompts, kind, k, batch):
    if kind == "ngram":
        proposer = NgramProposer(k, 1, 4)
    elif kind == "draft_random":
        proposer = DraftModelProposer(tiny_llama(1), k)
    elif kind == "draft_close":
        proposer = DraftModelProposer(tiny_llama(2, base=target, noise=0.3), k)
    else:
        proposer = DraftModelProposer(target, k)
    if batch == 1:
        outs = [decode(target, [p], SETTINGS, proposer)[0] for p in prompts]
    else:
        outs = decode(target, prompts, SETTINGS, proposer)
    assert [o.token_ids for o in outs] == greedy(target, prompts)
    drafted = sum(o.drafted for o in outs)
    accepted = sum(o.accepted for o in outs)
    assert drafted > 0
    if kind in ("ngram", "draft_close"):
        assert 0 < accepted < drafted
    if kind == "draft_self":
        assert accepted == drafted  # the target as its own draft never disagrees
        assert all(o.forward_passes < len(o.token_ids) for o in outs)


@pytest.mark.parametrize("kind", ["target", "ngram", "draft"])
def test_continuous_batching_equals_one_at_a_time(target, prompts, kind):
    """Two rows at a time over five prompts: finished rows are replaced mid-flight, results do not change."""
    many = prompts + [prompts[0][:17], prompts[2][3:]]
    settings = DecodeSettings(max_tokens=40, eos_ids=frozenset({greedy(target, many[:1])[0][9]}))
    proposer = {"target": None, "ngram": NgramProposer(3),
                "draft": DraftModelProposer(tiny_llama(2, base=target, noise=0.3), 3)}[kind]
    outs = decode(target, many, settings, proposer, batch_size=2)
    assert [o.token_ids for o in outs] == greedy(target, many, settings)
    assert len({len(o.token_ids) for o in outs}) > 1  # rows really finished at different times


def test_prefix_cache_is_exact_and_shared_between_paths(target, prompts):
    """Prompts sharing prefixes reuse cached blocks; a second path replays them without any prefill."""
    session = [prompts[0][:20], prompts[0][:20] + prompts[1][:9], prompts[0][:20] + prompts[1][:9] + [4, 5, 6]]
    cache = PrefixCache(block=8)
    first = decode(target, session, SETTINGS, prefix_cache=cache, batch_size=2)
    assert [o.token_ids for o in first] == greedy(target, session)
    assert cache.hit_tokens >= 16 + 24  # calls 2 and 3 found earlier calls' full blocks
    computed = cache.computed_tokens
    second = decode(target, session, SETTINGS, NgramProposer(4), prefix_cache=cache, batch_size=3)
    assert [o.token_ids for o in second] == [o.token_ids for o in first]
    assert cache.computed_tokens == computed  # every prompt was found whole, with its logits
    assert second[0].margins[0] == first[0].margins[0]  # bit-identical first logits on both paths
    small = PrefixCache(block=8, max_bytes=1)  # evicts everything but the newest block: still exact
    assert [o.token_ids for o in decode(target, session, SETTINGS, prefix_cache=small)] == greedy(target, session)


def test_margins_and_top2_come_from_the_deciding_logits(target, prompts):
    ref = decode(target, prompts[:1], SETTINGS)[0]
    spec = decode(target, prompts[:1], SETTINGS, NgramProposer(4))[0]
    assert [a for a, _ in ref.top2] == ref.token_ids
    assert all(m >= 0 for m in ref.margins) and len(ref.margins) == len(ref.token_ids)
    assert [a for a, _ in spec.top2] == spec.token_ids
    # Same tokens, logits from a differently shaped pass: margins agree to float64 rounding.
    assert spec.margins == pytest.approx(ref.margins, rel=1e-9, abs=1e-9)


def test_stop_strings_end_both_paths_at_the_same_token(target, prompts):
    def piece(t):
        return chr(65 + t % 26)

    ref = greedy(target, prompts[:1])[0]
    stop = piece(ref[12]) + piece(ref[13])
    first = next(i for i in range(1, len(ref)) if piece(ref[i - 1]) + piece(ref[i]) == stop)
    settings = DecodeSettings(max_tokens=40, stop_strings=(stop,), piece=piece)
    for proposer in (None, NgramProposer(5), DraftModelProposer(target, 5)):
        out = decode(target, prompts[:1], settings, proposer)[0]
        assert out.token_ids == ref[: first + 1]
        assert out.finish_reason == "stop"


def test_eos_and_max_tokens(target, prompts):
    ref = greedy(target, prompts)
    eos = ref[0][7]
    settings = DecodeSettings(max_tokens=25, eos_ids=frozenset({eos}))
    for proposer in (None, NgramProposer(5)):
        outs = decode(target, prompts, settings, proposer)
        for out, r in zip(outs, ref):
            stop_at = r.index(eos) + 1 if eos in r[:25] else 25
            assert out.token_ids == r[:stop_at]
            assert out.finish_reason == ("stop" if eos in r[:25] else "length")


def test_cache_rollback_matches_a_fresh_forward(target, prompts):
    """After a rejection, the logits that continue equal a fresh forward over the accepted sequence."""
    a, b = prompts[0][:20], prompts[1][:13]
    with torch.inference_mode():
        kv = KVBatch(target)
        kv.admit([a, b])
        kv.mark()
        kv.extend([[7, 8, 9, 10, 11], [12, 13]])
        kv.rollback([2, 1])  # row 0 keeps 7, 8; row 1 keeps 12: holes and a crop
        got = kv.extend([[20, 21], [22]])
        for row, (seq, width) in enumerate([(a + [7, 8, 20, 21], 2), (b + [12, 22], 1)]):
            fresh = target(input_ids=torch.tensor([seq])).logits[0, -width:]
            assert torch.allclose(got[row, :width], fresh, rtol=0, atol=1e-10)
        kv.select([1])  # the longer row leaves: leading padding is trimmed, logits unchanged
        again = kv.extend([[23]])
        fresh = target(input_ids=torch.tensor([b + [12, 22, 23]])).logits[0, -1]
        assert torch.allclose(again[0, 0], fresh, rtol=0, atol=1e-10)


def test_tokenizer_mismatch_is_a_config_error():
    with pytest.raises(ConfigError, match="draft vocabulary size 301 differs from the target's 300"):
        check_draft_compatible(300, 301)

    class Tok:
        def __init__(self, vocab):
            self.vocab = vocab

        def get_vocab(self):
            return self.vocab

    with pytest.raises(ConfigError, match="tokenizer differs"):
        check_draft_compatible(300, 300, Tok({"a": 0}), Tok({"b": 0}))
    check_draft_compatible(300, 300, Tok({"a": 0}), Tok({"a": 0}))


# ------------------------------------------------------------------------------------------ sampling

SAMPLE_VOCAB = 12


@pytest.fixture(scope="module")
def peaked():
    """Tiny target with peaked distributions, and a draft close to it (so proposals are sometimes rejected)."""
    model = tiny_llama(3, vocab=SAMPLE_VOCAB, head_scale=60.0)
    draft = tiny_llama(4, vocab=SAMPLE_VOCAB, base=model, noise=0.5)
    return model, draft


def exact_distribution(model, prompt, length=3):
    """P(t1..t_length) under the target at temperature 1, by enumerating every prefix."""
    probs = {(): 1.0}
    with torch.inference_mode():
        for _ in range(length):
            prefixes = list(probs)
            logits = model(input_ids=torch.tensor([prompt + list(p) for p in prefixes])).logits[:, -1]
            step = torch.softmax(logits, -1)
            probs = {p + (t,): probs[p] * float(step[i, t]) for i, p in enumerate(prefixes)
                     for t in range(SAMPLE_VOCAB)}
    return probs


def chi_square_ok(counts: Counter, expected: dict, n: int) -> tuple[float, float]:
    """Chi-square statistic over cells expecting >= 5 samples (the rest pooled) and a generous bound."""
    big = {c for c, p in expected.items() if p * n >= 5}
    stat, cells = 0.0, 0
    for c in big:
        e = expected[c] * n
        stat += (counts.get(c, 0) - e) ** 2 / e
        cells += 1
    rest_e = n * sum(p for c, p in expected.items() if c not in big)
    if rest_e >= 5:
        rest_o = n - sum(counts.get(c, 0) for c in big)
        stat += (rest_o - rest_e) ** 2 / rest_e
        cells += 1
    df = cells - 1
    return stat, df + 6 * math.sqrt(2 * df) + 10  # far beyond the 99.99th percentile


@pytest.mark.parametrize("kind", ["target", "draft", "ngram"])
def test_speculative_sampling_has_the_target_distribution(peaked, kind):
    model, draft = peaked
    # The target's own greedy continuation makes a prompt whose n-grams predict its likely next tokens.
    prompt = [1, 2, 3] + decode(model, [[1, 2, 3]], DecodeSettings(max_tokens=12))[0].token_ids
    n = 3000
    settings = DecodeSettings(max_tokens=3, temperature=1.0, seeds=tuple(range(n)))
    proposer = {"target": None, "draft": DraftModelProposer(draft, 2, temperature=1.0, prefix_cache=PrefixCache()),
                "ngram": NgramProposer(2, 1, 3)}[kind]
    outs = decode(model, [prompt] * n, settings, proposer, prefix_cache=PrefixCache())  # one prefill for all
    counts = Counter(tuple(o.token_ids) for o in outs)
    stat, bound = chi_square_ok(counts, exact_distribution(model, prompt), n)
    assert stat < bound, (kind, stat, bound)
    if kind != "target":
        drafted = sum(o.drafted for o in outs)
        accepted = sum(o.accepted for o in outs)
        assert 0 < accepted < drafted  # both the accept and the resample branches ran


def test_seeded_sampling_repeats_exactly(peaked):
    model, draft = peaked
    prompt = [1, 2, 3, 4, 1, 2]
    settings = DecodeSettings(max_tokens=12, temperature=1.0, seeds=(11, 12, 13))
    other = DecodeSettings(max_tokens=12, temperature=1.0, seeds=(21, 22, 23))
    for make in (lambda: None, lambda: NgramProposer(3), lambda: DraftModelProposer(draft, 3, temperature=1.0)):
        first = [o.token_ids for o in decode(model, [prompt] * 3, settings, make())]
        again = [o.token_ids for o in decode(model, [prompt] * 3, settings, make())]
        assert first == again
        assert first != [o.token_ids for o in decode(model, [prompt] * 3, other, make())]


# ------------------------------------------------------------------------------------------ engine


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, target):
    """A tiny model directory with a byte-level tokenizer and SmolLM2's chat template (no tool support)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    directory = tmp_path_factory.mktemp("tiny-model")
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    vocab.update({ch: i + 3 for i, ch in enumerate(sorted(alphabet))})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", bos_token="<|im_start|>", pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    fast.chat_template = (
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
        "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    fast.save_pretrained(directory)
    target.save_pretrained(directory)
    return directory


def test_engine_results_in_order_with_errors_as_rows(tiny_model_dir):
    from toolaudit.engines.torch_engine import TorchEngine
    from toolaudit.paths import PathConfig, PromptConfig, SpeculativeConfig

    tools = [{"type": "function", "function": {"name": "get_quote", "parameters": {"type": "object"}}}]
    requests = [
        EngineRequest(key=f"k{i}", messages=[{"role": "user", "content": "price of AMZN " * (i + 1)}], tools=tools)
        for i in range(4)
    ]
    requests.insert(2, EngineRequest(key="bad", messages=[{"role": "user", "content": "x" * 1200}], tools=tools))
    common = dict(model=str(tiny_model_dir), dtype="float64", batch_size=3, max_tokens=12,
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


def test_rendering_hermes_prompt(tiny_model_dir):
    from toolaudit.paths import PromptConfig
    from toolaudit.prompting import render, template_supports_tools

    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    assert not template_supports_tools(tokenizer)
    tools = [{"type": "function", "function": {"name": "get_quote", "description": "Price.",
                                               "parameters": {"type": "object",
                                                              "properties": {"symbol": {"type": "string"}}}}}]
    messages = [
        {"role": "system", "content": "You are a bank."},
        {"role": "user", "content": "Price of AMZN?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_quote", "arguments": "{\"symbol\":\"AMZN\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "{\"price\": 1}"},
        {"role": "tool", "tool_call_id": "c2", "content": "{\"price\": 2}"},
        {"role": "user", "content": [{"type": "text", "text": "And MSFT?"}]},
    ]
    text = render(tokenizer, messages, tools, PromptConfig(few_shot=1, prefill="<tool_call>\n")).text
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nYou are a bank.\n\n")
    assert '{"name":"get_quote","description":"Price.","parameters":' in system
    assert '"name":"get_weather"' in system and "search_flights" not in text  # one example, listed with the tools
    assert "What's the weather in Paris" in text
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_quote", "arguments": {"symbol": "AMZN"}}\n'
            "</tool_call><|im_end|>") in text
    assert ("<|im_start|>user\n<tool_response>\n{\"price\": 1}\n</tool_response>\n<tool_response>\n"
            "{\"price\": 2}\n</tool_response><|im_end|>") in text
    assert text.endswith("<|im_start|>user\nAnd MSFT?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n")
    bare = render(tokenizer, [{"role": "user", "content": "hi"}], [], PromptConfig()).text
    assert "<tools>" not in bare and "Paris" not in bare  # no tools: no tool list, no examples
