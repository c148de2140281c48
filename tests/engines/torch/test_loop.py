"""Exactness of the decode loop on tiny random Llama models in float64.

In exact arithmetic speculative greedy decoding equals target greedy decoding, and speculative sampling has the
target's distribution. float64 is close enough to exact that these hold token for token, which is what lets
toolaudit attribute bf16 drift to numerics rather than to the loops.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
from helpers import MAX_TOKENS, greedy, tiny_llama

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from toolaudit.engines.torch.loop import DecodeSettings, decode  # noqa: E402
from toolaudit.engines.torch.prefix_cache import PrefixCache  # noqa: E402
from toolaudit.engines.torch.proposers import DraftModelProposer, NgramProposer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
SETTINGS = DecodeSettings(max_tokens=MAX_TOKENS)


def test_batched_target_equals_one_at_a_time(target, prompts):
    batched = decode(target, prompts, SETTINGS)
    assert [o.token_ids for o in batched] == greedy(target, prompts)
    assert all(o.forward_passes == len(o.token_ids) for o in batched)  # one token per pass


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


def test_value_end_stops_every_path_where_the_answers_json_closes(target, prompts):
    """A row ends at the token that closes the JSON value its answer opens with, also inside a verification
    pass that accepted tokens past it."""
    from toolaudit.engines.completion import ValueEnd

    ref = greedy(target, prompts[:1])[0]
    closer = next(t for t in ref[3:] if t != ref[0])  # the first token ref[0] is "{", `closer` is "}"

    def piece(t):
        return "{" if t == ref[0] else "}" if t == closer else "a"

    scanner = ValueEnd()
    close = next(i for i, t in enumerate(ref) if scanner.feed(piece(t)) is not None)
    assert 0 < close < len(ref) - 1
    settings = DecodeSettings(max_tokens=40, value_end=True, piece=piece)
    for proposer in (None, NgramProposer(5), DraftModelProposer(target, 5)):
        out = decode(target, prompts[:1], settings, proposer)[0]
        assert out.token_ids == ref[: close + 1] and out.finish_reason == "stop"
    assert decode(target, prompts[:1], DecodeSettings(max_tokens=40, piece=piece))[0].token_ids == ref[:40]
