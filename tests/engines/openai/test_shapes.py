"""Chat Completions shapes: streamed tool-call deltas joined back into one response, logprobs turned into decode
evidence, and the token-text fallback of `first_divergence` that evidence feeds."""

from __future__ import annotations

from toolaudit.engines import EngineResult
from toolaudit.engines.openai.shapes import StreamAggregate, logprob_evidence
from toolaudit.replay.replayer import first_divergence


def test_stream_aggregate_joins_tool_call_argument_deltas():
    agg = StreamAggregate()
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant"}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f",
                                                                                               "arguments": ""}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 1, "id": "b", "function": {"name": "g"}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"x":'}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": " 1}"}}]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}], "system_fingerprint": "fp"},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}},
    ]
    for i, c in enumerate(chunks):
        agg.add(c, float(i))
    body = agg.response()
    calls = body["choices"][0]["message"]["tool_calls"]
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("a", "f", '{"x": 1}'), ("b", "g", "{}")]
    assert body["choices"][0]["finish_reason"] == "tool_calls" and body["usage"]["completion_tokens"] == 4
    assert body["system_fingerprint"] == "fp" and agg.first_token_at == 1.0


def test_logprob_evidence_and_token_fallback_of_first_divergence():
    entries = [{"token": "token_id:7", "logprob": -0.5, "top_logprobs": [
        {"token": "token_id:9", "logprob": -1.5}, {"token": "token_id:7", "logprob": -0.5}]}]
    tokens, margins, ids, top2 = logprob_evidence(entries)
    assert (tokens, margins, ids, top2) == ([], [1.0], [7], [(7, 9)])
    tokens, margins, ids, top2 = logprob_evidence([{"token": "a", "logprob": -1, "top_logprobs": [
        {"token": "a", "logprob": -1}]}])
    assert (margins, ids, top2) == ([], [], [])  # one alternative: no margin, positions never shift
    base = EngineResult("k", tokens=["a", "b", "c"], margins=[1.0, 2.0, 3.0])
    cand = EngineResult("k", tokens=["a", "x"], margins=[1.5, 0.25])
    assert first_divergence(base, cand, None) == (1, "b", "x", 2.0, 0.25)
    assert first_divergence(base, EngineResult("k", tokens=["a", "b", "c"]), None) is None
    ids = EngineResult("k", token_ids=[1, 2], tokens=["z", "z"])
    assert first_divergence(ids, EngineResult("k", token_ids=[1, 3]), None)[:3] == (1, "2", "3")
    # ids on one side, token texts on the other: no evidence rather than a false divergence
    assert first_divergence(EngineResult("k", token_ids=[1, 2]), cand, None) is None
