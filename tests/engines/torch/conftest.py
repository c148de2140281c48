"""Fixtures of the embedded-engine tests: tiny random Llamas in float64, exact enough that speculative decoding
must equal target greedy token for token, and a model directory around one. torch is imported when a fixture
runs (test modules skip without it). `one_thread` is opt-in per module: the real-model tests keep their threads.
"""

from __future__ import annotations

import pytest
from helpers import VOCAB, tiny_llama


@pytest.fixture(scope="module")
def one_thread():
    """Tiny matrices gain nothing from threads, and spinning threads suffer badly on a shared 2-core machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module", params=["sdpa", "toolaudit"])
def target(request):
    """The target under transformers' sdpa attention and under the engine's own grouped attention."""
    from toolaudit.engines.torch.attention import use_grouped_attention

    model = tiny_llama(0)
    if request.param == "toolaudit":
        use_grouped_attention(model)
    return model


@pytest.fixture(scope="module")
def prompts():
    import torch

    g = torch.Generator().manual_seed(5)
    base = torch.randint(3, VOCAB, (12,), generator=g).tolist()
    # Repetitive prompts so that n-gram lookup finds proposals; ragged lengths exercise padding.
    return [base * 3, base[:7] * 4 + [5, 6], base[:5] * 5 + [9]]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, target, chat_tokenizer):
    """A tiny model directory with a byte-level tokenizer and SmolLM2's chat template (no tool support)."""
    directory = tmp_path_factory.mktemp("tiny-model")
    chat_tokenizer.save_pretrained(directory)
    target.save_pretrained(directory)
    return directory
