"""Sampled requests through a real `toolaudit serve` app (aiohttp on loopback, the real torch engine on the tiny
random Llama, float32, one thread), replayed by the openai engine with the real openai client.

What must hold, token for token against the same path decoding in process (same request composition per engine
call, prefix caching off: see test_app.py on equal numerics):
- `samples_via = "n"`: one request per call with n = N and the seed of sample 0; choice i is the served path's
  sample i of key `seed:<that seed>`, i.e. `row_seed(path seed, key, i)`;
- `samples_via = "seed"`: N requests; sample i is sample 0 of key `seed:<sample i's seed>`. So the two ways agree
  on sample 0 only: the server derives n choices from one seed, which per-sample seeds cannot reproduce;
- samples of one call differ (temperature 1 on a random model), a rerun gives the same, a streamed n request
  the same as an unstreamed one, top_k = 1 (sent as vLLM's extension field) the greedy answer;
- over raw HTTP: n choices indexed 0..n-1, usage counting the prompt once and summing completions, choice 0
  what n = 1 gives with the same seed.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from helpers import AppThread, build_tiny_model, openai_path_toml, post

from toolaudit.engines import EngineRequest, make_engine
from toolaudit.engines.openai.engine import request_seed
from toolaudit.engines.paths import load_paths, parse_path

N = 3
CALLS = {"call-a": [{"role": "user", "content": "What is the price of AMZN?"}],
         "call-b": [{"role": "user", "content": "Book a table for two at 7pm."}]}
TOKEN_IDS = "{ return_tokens_as_token_ids = true }"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    import torch

    from toolaudit.serve.app import EngineHost, build_app
    from toolaudit.serve.metrics import Metrics

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model = build_tiny_model(tmp_path_factory.mktemp("tiny"))
    path = parse_path("tiny", {"engine": "torch", "model": str(model), "dtype": "float32", "batch_size": 1,
                               "max_tokens": 8, "temperature": 1.0, "seed": 5, "prefix_caching": False,
                               "threads": 1})
    host = EngineHost(path, Metrics("tiny"), 0.005)
    app = AppThread(build_app(path, host), on_start=(host.start(),))
    try:
        with make_engine(path) as local:
            yield path, app.base_url, local
    finally:
        app.close()
        host.close()
        torch.set_num_threads(threads)


def client(tmp_path, base_url: str, **keys):
    file = tmp_path / "client.toml"
    file.write_text(openai_path_toml("http", base_url, "tiny", max_tokens=8, temperature=1.0, seed=7, samples=N,
                                     logprobs=True, extra_body=TOKEN_IDS, **keys))
    return make_engine(load_paths(file)["http"])


def sampled() -> list[EngineRequest]:
    return [EngineRequest(key, messages, sample=i) for key, messages in CALLS.items() for i in range(N)]


def replay(tmp_path, base_url: str, **keys) -> list[list[int]]:
    with client(tmp_path, base_url, **keys) as engine:
        results = engine.generate(sampled())
    assert all(r.ok and r.token_ids for r in results), [r.error for r in results]
    assert {r.samples_via for r in results} == {keys.get("samples_via", "seed")}
    return [r.token_ids for r in results]


def test_n_and_seed_ways_decode_the_served_paths_samples(tmp_path, served):
    path, base_url, local = served
    via_n = replay(tmp_path, base_url, samples_via="n")
    via_seed = replay(tmp_path, base_url, samples_via="seed")
    expect_n, expect_seed = [], []
    for key, messages in CALLS.items():
        sample0 = request_seed(7, key, 0)
        expect_n += [r.token_ids for r in local.generate(
            [EngineRequest(f"seed:{sample0}", messages, sample=i) for i in range(N)])]  # one engine call, as served
        for i in range(N):
            expect_seed += [local.generate([EngineRequest(f"seed:{request_seed(7, key, i)}", messages)])[0].token_ids]
    assert via_n == expect_n and via_seed == expect_seed
    for start in range(0, len(via_n), N):
        assert via_n[start] == via_seed[start]  # sample 0: the same seed either way
        assert len({tuple(t) for t in via_n[start: start + N]}) == N  # samples of one call differ
        assert len({tuple(t) for t in via_seed[start: start + N]}) == N
    assert replay(tmp_path, base_url, samples_via="n", stream=True) == via_n  # reproducible, and streamed alike


def test_top_k_1_through_serve_is_greedy(tmp_path, served):
    path, base_url, local = served
    top1 = replay(tmp_path, base_url, samples_via="seed", top_k=1)
    with make_engine(replace(path, temperature=0.0)) as greedy:
        expected = [r.token_ids for r in greedy.generate(sampled())]
    assert top1 == expected


def test_n_choices_over_http(served):
    path, base_url, local = served
    body = {"model": "tiny", "messages": CALLS["call-a"], "seed": 11, "max_tokens": 8}
    status, raw = post(base_url + "/chat/completions", {**body, "n": N})
    assert status == 200
    data = json.loads(raw)
    single = json.loads(post(base_url + "/chat/completions", body)[1])
    assert [c["index"] for c in data["choices"]] == list(range(N))
    assert data["choices"][0]["message"] == single["choices"][0]["message"]
    assert len({c["message"]["content"] for c in data["choices"]}) == N
    usage, one = data["usage"], single["usage"]
    assert usage["prompt_tokens"] == one["prompt_tokens"] and usage["completion_tokens"] == N * 8  # max_tokens each
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
