"""The openai engine's sampled requests, observed at a loopback endpoint (aiohttp, in-process) that records every
request body: per-call seeds, top_p and top_k in the body, and `samples_via` ("n", "seed", and "auto" falling
back when the endpoint refuses n or answers with fewer choices).

The endpoint is a stand-in written for these tests: it answers each choice with text naming the seed and choice
it was asked for, so what reached which result is checked exactly. Its two refusing modes stand in for servers
that do not implement `n` (400 naming n, as `toolaudit serve` did before it served n, and some gateways do) or
silently answer one choice. Sampling itself on a real server: tests/serve/test_sampled.py.
"""

from __future__ import annotations

import pytest
from aiohttp import web
from helpers import AppThread, openai_path_toml

from toolaudit.engines import EngineRequest, make_engine
from toolaudit.engines.openai.engine import request_seed
from toolaudit.engines.paths import load_paths

MESSAGES = [{"role": "user", "content": "What is the price of AMZN?"}]


class Endpoint:
    """A Chat Completions endpoint that records bodies. `refuse_n`: None (serves n), "400" (an OpenAI-shaped 400
    naming n for n > 1) or "one" (ignores n: always one choice)."""

    def __init__(self, refuse_n: str | None = None):
        self.refuse_n, self.bodies = refuse_n, []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        n = body.get("n", 1)
        if n > 1 and self.refuse_n == "400":
            return web.json_response({"error": {"message": "only n = 1 is supported", "type": "invalid_request_error",
                                                "param": "n", "code": "unsupported_value"}}, status=400)
        choices = 1 if self.refuse_n == "one" else n
        return web.json_response({
            "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": i, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": f"seed={body.get('seed')} choice={i}"}}
                        for i in range(choices)],
            "usage": {"prompt_tokens": 5, "completion_tokens": 3 * choices, "total_tokens": 5 + 3 * choices}})


@pytest.fixture
def endpoint(request, tmp_path):
    stub = Endpoint(getattr(request, "param", None))
    app = AppThread(stub.app())
    stub.base_url = app.base_url
    yield stub
    app.close()


def engine_for(tmp_path, endpoint, **keys):
    file = tmp_path / "paths.toml"
    file.write_text(openai_path_toml("p", endpoint.base_url, "m", **keys))
    return make_engine(load_paths(file)["p"])


def sampled(keys: tuple[str, ...], n: int) -> list[EngineRequest]:
    """Each call's samples 0..n-1, consecutive, as a sampled replay sends them."""
    return [EngineRequest(key, MESSAGES, sample=i) for key in keys for i in range(n)]


def test_each_call_and_sample_sends_its_own_seed_with_top_p_and_top_k(tmp_path, endpoint):
    with engine_for(tmp_path, endpoint, temperature=1.0, seed=7, top_p=0.9, top_k=20, samples_via="seed") as engine:
        results = engine.generate(sampled(("call-a", "call-b"), 2))
    seeds = [b["seed"] for b in endpoint.bodies]
    expected = [request_seed(7, key, i) for key in ("call-a", "call-b") for i in range(2)]
    assert sorted(seeds) == sorted(expected) and len(set(seeds)) == 4  # two calls of a path: different seeds
    assert all(0 <= s < 2**31 for s in seeds)
    assert request_seed(7, "call-a", 0) != 7  # no longer the path's seed itself
    assert all(b["top_p"] == 0.9 and b["top_k"] == 20 and "n" not in b for b in endpoint.bodies)
    assert [r.text for r in results] == [f"seed={s} choice=0" for s in expected]  # in request order
    assert [r.samples_via for r in results] == ["seed"] * 4


def test_greedy_paths_send_no_seed_top_p_or_top_k(tmp_path, endpoint):
    with engine_for(tmp_path, endpoint, temperature=0.0) as engine:
        results = engine.generate(sampled(("call-a",), 1))
    assert results[0].ok and results[0].samples_via is None
    assert not {"seed", "top_p", "top_k", "n"} & set(endpoint.bodies[0])


def test_samples_via_n_sends_one_request_per_call(tmp_path, endpoint):
    with engine_for(tmp_path, endpoint, temperature=1.0, seed=7, samples=3, samples_via="n") as engine:
        results = engine.generate(sampled(("call-a", "call-b"), 3))
        resumed = engine.generate([EngineRequest("call-a", MESSAGES, sample=2)])  # a resume's lone sample 2
    assert sorted((b["n"], b["seed"]) for b in endpoint.bodies[:2]) == sorted(
        (3, request_seed(7, key, 0)) for key in ("call-a", "call-b"))
    seed_a = request_seed(7, "call-a", 0)
    assert [r.text for r in results[:3]] == [f"seed={seed_a} choice={i}" for i in range(3)]
    assert [r.key for r in results] == ["call-a"] * 3 + ["call-b"] * 3
    assert all(r.samples_via == "n" and r.prompt_tokens == 5 for r in results)
    assert endpoint.bodies[2]["n"] == 3 and resumed[0].text == results[2].text  # choice 2 of the same request


@pytest.mark.parametrize("endpoint", ["400", "one"], indirect=True)
def test_auto_falls_back_to_seeds_for_good(tmp_path, endpoint):
    with engine_for(tmp_path, endpoint, temperature=1.0, seed=7, samples=3, concurrency=1) as engine:
        first = engine.generate(sampled(("call-a",), 3))
        later = engine.generate(sampled(("call-b",), 3))
    asked_n = [b for b in endpoint.bodies if b.get("n", 1) > 1]
    assert len(asked_n) == 1  # tried once; every later call goes per sample
    for key, results in (("call-a", first), ("call-b", later)):
        assert [r.text for r in results] == [f"seed={request_seed(7, key, i)} choice=0" for i in range(3)]
        assert [r.samples_via for r in results] == ["seed"] * 3 and all(r.ok for r in results)


@pytest.mark.parametrize("endpoint", ["400", "one"], indirect=True)
def test_samples_via_n_reports_a_refusal_as_error_rows(tmp_path, endpoint):
    with engine_for(tmp_path, endpoint, temperature=1.0, samples=2, samples_via="n", max_retries=0) as engine:
        results = engine.generate(sampled(("call-a",), 2))
    assert [r.key for r in results] == ["call-a", "call-a"]
    if endpoint.refuse_n == "400":
        assert all(r.error.startswith("HTTP 400: only n = 1") for r in results)
    else:  # choice 0 came, choice 1 did not
        assert results[0].ok and results[1].error.startswith("fewer choices than asked for")
