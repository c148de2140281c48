"""How `VLLMEngine` turns vLLM outputs into `EngineResult`s, on a stand-in `vllm.LLM` (no vLLM needed): margins
and top-2 from ranked logprobs, text as the torch engine builds it, per-request and aggregate speculative
counters, refusing a "speculative" call that drafted nothing, and a bad request failing alone."""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import SimpleNamespace

import pytest

from toolaudit.engines.base import EngineRequest
from toolaudit.engines.local import Prompt
from toolaudit.engines.paths import builtin_paths
from toolaudit.engines.vllm.engine import VLLMEngine
from toolaudit.engines.vllm.evidence import shares


class Tokenizer:
    """Token id n is the character chr(n); id 0 is a special token (skipped)."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids if i or not skip_special_tokens)


def output(ids, spec=None, prompt=3, finish="stop"):
    logprobs = [{t: SimpleNamespace(logprob=-0.5, rank=1), t + 1: SimpleNamespace(logprob=-2.0, rank=2)} for t in ids]
    return SimpleNamespace(
        prompt_token_ids=list(range(prompt)), metrics=None,
        outputs=[SimpleNamespace(token_ids=ids, logprobs=logprobs, finish_reason=finish, spec_decode_metrics=spec)])


class FakeLLM:
    def __init__(self, outputs, counters=(0, 0), fail_on=None):
        self.outputs, self.counters, self.fail_on, self.calls = outputs, counters, fail_on, []

    def generate(self, inputs, params, use_tqdm=False):
        self.calls.append(len(inputs))
        if self.fail_on is not None and any(i["prompt_token_ids"] == self.fail_on for i in inputs):
            raise ValueError("bad prompt")
        by_prompt = {tuple(o.prompt_token_ids): o for o in self.outputs}
        return [by_prompt[tuple(i["prompt_token_ids"])] for i in inputs]

    def get_metrics(self):
        drafted, accepted = self.counters
        self.counters = (drafted * 2, accepted * 2)  # cumulative: the call's delta is the first value
        return [SimpleNamespace(name="vllm:spec_decode_num_draft_tokens", value=drafted),
                SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens", value=accepted)]


def engine(llm, name="target", **changes) -> VLLMEngine:
    """A VLLMEngine whose LLM is the stand-in, marked loaded (so `generate` loads nothing)."""
    e = VLLMEngine(replace(builtin_paths()[name], engine="vllm", **changes))
    e._model, e._tokenizer, e._max_len, e._loaded = llm, Tokenizer(), 100, True
    e._sampling = lambda key: None
    e._prepare = lambda req: Prompt(list(range(int(req.key))), "<tool_call>\n")
    return e


def reqs(*prompt_lengths):
    return [EngineRequest(key=str(n), messages=[]) for n in prompt_lengths]


def test_result_fields_margins_and_text():
    ids = [ord(c) for c in '{"a": 1}\n</tool_call>\nxx'] + [0]
    results = engine(FakeLLM([output(ids)])).generate(reqs(3))
    (r,) = results
    # prefill in, cut where the call's JSON closes (`PathConfig.value_end`); the tokens vLLM decoded stay counted
    assert r.error is None and r.text == '<tool_call>\n{"a": 1}'
    assert r.token_ids == ids and r.completion_tokens == len(ids) and r.prompt_tokens == 3
    assert r.margins == [1.5] * len(ids) and r.top2 == [(t, t + 1) for t in ids]
    assert r.finish_reason == "stop" and r.forward_passes == len(ids) and r.drafted_tokens == 0
    (explicit,) = engine(FakeLLM([output(ids)]), stop=("</tool_call>",)).generate(reqs(3))
    assert explicit.text == '<tool_call>\n{"a": 1}\n</tool_call>'  # an explicit stop: cut after it only


def test_a_call_that_closed_before_max_tokens_stopped_there():
    closed = [ord(c) for c in '{"a": 1}\n<tool_call>\n{"b": 2']
    open_ = [ord(c) for c in '{"a": "1}\n</tool']
    results = engine(FakeLLM([output(closed, finish="length"), output(open_, prompt=4, finish="length")])
                     ).generate(reqs(3, 4))
    assert [(r.text, r.finish_reason) for r in results] == [('<tool_call>\n{"a": 1}', "stop"),
                                                            ('<tool_call>\n{"a": "1}\n</tool', "length")]


def test_per_request_spec_metrics():
    spec = SimpleNamespace(histogram=[1, 0, 2], num_draft_tokens=9)  # 3 verify steps, 4 drafts accepted
    llm = FakeLLM([output([65] * 10, spec=spec)], counters=(9, 4))
    (r,) = engine(llm, "spec-ngram").generate(reqs(3))
    assert (r.drafted_tokens, r.accepted_tokens) == (9, 4)
    # 10 tokens = 1 (prefill) + 3 steps (+4 accepted) + 2 plain steps -> 1 + 3 + 2 passes
    assert r.forward_passes == 6 and r.acceptance_rate == pytest.approx(4 / 9)


def test_aggregate_counters_shared_when_per_request_metrics_missing():
    llm = FakeLLM([output([65] * 11, prompt=3), output([66] * 31, prompt=4), output([67], prompt=5)], counters=(40, 8))
    results = engine(llm, "spec-ngram").generate(reqs(3, 4, 5))
    assert [r.drafted_tokens for r in results] == [10, 30, 0]  # in proportion to tokens after the first
    assert [r.accepted_tokens for r in results] == [2, 6, 0]
    assert shares(10, [1, 1, 1]) == [4, 3, 3] and sum(shares(7, [5, 0, 2])) == 7


def test_speculative_call_that_drafted_nothing_is_an_error():
    llm = FakeLLM([output([65] * 5, prompt=3), output([66], prompt=4)], counters=(0, 0))
    results = engine(llm, "spec-ngram").generate(reqs(3, 4))
    assert all(r.error and "speculative decoding did not run" in r.error for r in results)
    assert [r.key for r in results] == ["3", "4"]
    one_token = FakeLLM([output([65], prompt=3)], counters=(0, 0))  # nothing to draft for: not an error
    assert engine(one_token, "spec-ngram").generate(reqs(3))[0].error is None


def test_a_rejected_request_fails_alone():
    llm = FakeLLM([output([65], prompt=3), output([66], prompt=5)], fail_on=list(range(4)))
    results = engine(llm).generate(reqs(3, 4, 5))
    assert [r.error is None for r in results] == [True, False, True]
    assert "bad prompt" in results[1].error
    assert llm.calls == [3, 1, 1, 1]  # the batch, then one by one


def test_unfinished_request_is_an_error():
    (r,) = engine(FakeLLM([output([65], finish="abort")])).generate(reqs(3))
    assert r.error and "abort" in r.error and r.finish_reason is None


def test_vllm_0_26_outputs_without_per_request_figures_share_the_counters(monkeypatch):
    """vLLM 0.26 (the lent GPUs') has neither `per_request_spec_decode_metrics` nor
    `CompletionOutput.spec_decode_metrics`: the engine asks for them only where they exist (`compat`) and shares
    the call's aggregate counters instead, on the same code path as 0.32."""
    import vllm.config

    from toolaudit.engines.vllm import compat

    assert compat.per_request_spec_metrics() and compat.spec_kwargs() == {"per_request_spec_decode_metrics": "summary"}

    @dataclass
    class ObservabilityConfig026:  # the 0.26 fields around where 0.32 added the option
        collect_detailed_traces: list | None = None
        kv_cache_metrics: bool = False

    monkeypatch.setattr(vllm.config, "ObservabilityConfig", ObservabilityConfig026)
    compat.per_request_spec_metrics.cache_clear()
    try:
        assert not compat.per_request_spec_metrics() and compat.spec_kwargs() == {}
    finally:
        compat.per_request_spec_metrics.cache_clear()
    old = [output([65] * 11, prompt=3), output([66] * 31, prompt=4)]
    for o in old:
        del o.outputs[0].spec_decode_metrics  # the 0.26 CompletionOutput
    results = engine(FakeLLM(old, counters=(40, 8)), "spec-ngram").generate(reqs(3, 4))
    assert [r.drafted_tokens for r in results] == [10, 30] and [r.accepted_tokens for r in results] == [2, 6]
