"""`toolaudit serve` for real: subprocess servers around tiny-model paths, replayed through with the real openai
client, must store what the in-process embedded engine stores, token for token; streaming must equal
non-streaming; the spec-decode counters must move; bad requests get OpenAI-shaped 4xx errors.

Equality needs equal numerics: both sides decode one request per engine call (batch_size 1; a batched pass
reduces in another order; batching is tested with a fake engine below) and the paths turn prefix caching off
(a prompt whose prefix is cached is prefilled in two pieces, whose rounding depends on what earlier requests
left in the cache, and request order differs between an in-process replay and concurrent HTTP requests).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import pytest
from helpers import (
    DEMO,
    REPO,
    AppThread,
    ServeProcess,
    build_tiny_model,
    get,
    openai_path_toml,
    post,
    torch_path_toml,
)

from toolaudit.engines import Capabilities, Engine, EngineRequest, EngineResult, make_engine
from toolaudit.engines.paths import load_paths
from toolaudit.replay.replayer import ReplayOptions, load_calls, replay_traces
from toolaudit.store import Store
from toolaudit.validate.toolcalls import parse_message

LIMIT = 12
# A prefill holding a whole tool call: the tiny models cannot write one, so this makes every completion carry a
# real call (plus whatever the model appends), which the server must return in `tool_calls`.
CALL_PREFILL = '<tool_call>\n{"name": "get_quote", "arguments": {"symbol": "AMZN", "limit": 3}}\n</tool_call>\n'
TOKEN_IDS = '{ return_tokens_as_token_ids = true }'


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the servers (see ServeProcess): same numerics, same fingerprint, and fast
    root = tmp_path_factory.mktemp("serve")
    rand, echo = build_tiny_model(root / "tiny"), build_tiny_model(root / "echo", echo=True)
    torch_paths = (torch_path_toml("tiny", rand, prefix_caching=False)
                   + torch_path_toml("echo-spec", echo, speculative=True, max_tokens=16, prefill=CALL_PREFILL,
                                     prefix_caching=False))
    serve_file = root / "serve.toml"
    serve_file.write_text(torch_paths)
    servers = {name: ServeProcess(serve_file, name, root / f"{name}.log") for name in ("tiny", "echo-spec")}
    try:
        for server in servers.values():
            server.wait()
        yield SimpleNamespace(root=root, torch_paths=torch_paths, servers=servers)
    finally:
        torch.set_num_threads(threads)
        codes = [server.stop() for server in servers.values()]
        assert all(code == 0 for code in codes), codes  # SIGTERM is a clean shutdown


def audit_paths(tmp_path: Path, setup, **options) -> Path:
    s = setup.servers
    text = setup.torch_paths
    text += openai_path_toml("http-tiny", s["tiny"].base_url, "tiny", logprobs=True, extra_body=TOKEN_IDS,
                             **options)
    text += openai_path_toml("http-echo", s["echo-spec"].base_url, "echo-spec", max_tokens=16, logprobs=True,
                             extra_body=TOKEN_IDS, **options)
    text += openai_path_toml("http-echo-stream", s["echo-spec"].base_url, "echo-spec", max_tokens=16,
                             logprobs=True, stream=True, extra_body=TOKEN_IDS, **options)
    path = tmp_path / "paths.toml"
    path.write_text(text)
    return path


def replay(db: Path, paths: Path, baseline: str, candidate: str):
    options = ReplayOptions(traces=[str(DEMO)], baseline=baseline, candidate=candidate, paths_file=str(paths),
                            limit=LIMIT, schema_dir=str(REPO / "schemas"))
    with Store(db) as store:
        run_id, counts = replay_traces(store, options)
        outputs = store.rows("""SELECT session_id, call_index, side, text, tool_calls, parse_status, token_ids,
                                       prompt_tokens, completion_tokens, error, system_fingerprint
                                FROM outputs WHERE run_id = ? ORDER BY ALL""", [run_id])
        calls = store.query("""SELECT session_id, call_index, match_status, drift_kind, first_divergence,
                                      baseline_margin, candidate_margin
                               FROM calls WHERE run_id = ? ORDER BY session_id, call_index""", [run_id])[1]
    return counts, outputs, calls


def requests(n: int = 6) -> list[EngineRequest]:
    calls, _, _ = load_calls(ReplayOptions(traces=[str(DEMO)], limit=n))
    return [EngineRequest(f"{c.session_id}\x1f{c.call_index}", c.request["messages"], c.tools) for c in calls]


def test_replay_through_serve_equals_embedded(tmp_path, setup):
    """Baseline: random tiny model, target-only, no tool call in its text (the server returns the text whole),
    non-streamed. Candidate: the echo model with n-gram speculation and a tool call, streamed. Through HTTP
    both must store what the in-process replay stores."""
    paths = audit_paths(tmp_path, setup)
    counts_e, out_e, calls_e = replay(tmp_path / "embedded.duckdb", paths, "tiny", "echo-spec")
    counts_h, out_h, calls_h = replay(tmp_path / "http.duckdb", paths, "http-tiny", "http-echo-stream")
    assert counts_e.errors == counts_h.errors == 0 and counts_h.replayed == LIMIT
    assert len(out_h) == len(out_e) == 2 * LIMIT
    for e, h in zip(out_e, out_h):
        assert (e["session_id"], e["call_index"], e["side"]) == (h["session_id"], h["call_index"], h["side"])
        assert h["token_ids"] == e["token_ids"] and e["token_ids"]  # token for token
        assert (h["parse_status"], h["tool_calls"]) == (e["parse_status"], e["tool_calls"])
        assert (h["prompt_tokens"], h["completion_tokens"]) == (e["prompt_tokens"], e["completion_tokens"])
        if e["side"] == "baseline":
            assert e["parse_status"] == "unparseable" and h["text"] == e["text"]
        else:
            assert e["parse_status"] == "ok" and json.loads(e["tool_calls"])[0]["name"] == "get_quote"
        server = setup.servers["tiny" if h["side"] == "baseline" else "echo-spec"]
        assert h["system_fingerprint"] == json.loads(get(server.root + "/health")[1])["fingerprint"]
    # verdicts, first divergent token and both margins (from logprobs over HTTP) agree exactly
    assert calls_h == calls_e
    assert all(c[4] == 0 and c[5] > 0 and c[6] > 0 for c in calls_h)  # different models: they part at once
    # acceptance over HTTP comes from the servers' /metrics counters (engines/openai/metrics.py), and equals what
    # the embedded engine counted in process; the target-only path drafts nothing ("-")
    perf = {}
    for db in ("embedded", "http"):
        with Store(tmp_path / f"{db}.duckdb", read_only=True) as store:
            perf[db] = store.rows("SELECT side, drafted_tokens, accepted_tokens, acceptance_rate "
                                  "FROM path_performance ORDER BY side")
    assert perf["http"] == perf["embedded"]
    assert [(p["side"], p["acceptance_rate"] is None) for p in perf["http"]] == [("baseline", True),
                                                                                  ("candidate", False)]
    assert perf["http"][1]["accepted_tokens"] > 0


def test_served_fingerprint_is_the_paths_fingerprint(setup):
    from toolaudit.engines.fingerprint import fingerprint

    path = load_paths(setup.root / "serve.toml")["tiny"]
    health = json.loads(get(setup.servers["tiny"].root + "/health")[1])
    assert health == {"status": "ok", "path": "tiny",
                      "fingerprint": fingerprint(make_engine(path).fingerprint_components())}


def test_any_in_process_engine_is_served(tmp_path, setup):
    """serve hosts engines by capability (`in_process`), not by name: an hf path (generate() on the tiny model)
    called over HTTP gives the tokens the hf engine gives in process, under the same fingerprint."""
    from toolaudit.engines.fingerprint import fingerprint

    serve_file = tmp_path / "hf.toml"
    serve_file.write_text(f'[paths.tiny-hf]\nengine = "hf"\nmodel = "{setup.root / "tiny"}"\ndtype = "float32"\n'
                          'max_tokens = 12\nthreads = 1\n')
    server = ServeProcess(serve_file, "tiny-hf", tmp_path / "hf.log")
    try:
        client = load_paths(_write(tmp_path, openai_path_toml("http-hf", server.wait(), "tiny-hf", logprobs=True,
                                                              extra_body=TOKEN_IDS)))["http-hf"]
        with make_engine(client) as engine:
            over_http = engine.generate(requests(3))
        health = json.loads(get(server.root + "/health")[1])
    finally:
        assert server.stop() == 0
    with make_engine(load_paths(serve_file)["tiny-hf"]) as local:
        in_process = local.generate(requests(3))
        assert health["fingerprint"] == fingerprint(local.fingerprint_components())
    for h, e in zip(over_http, in_process):
        assert h.ok and e.ok and e.token_ids, (h.error, e.error)
        assert (h.token_ids, h.top2, h.completion_tokens) == (e.token_ids, e.top2, e.completion_tokens)


def _same_answer(a: EngineResult, b: EngineResult) -> None:
    strip = [{**c, "id": None} for c in a.message.get("tool_calls") or []]
    assert strip == [{**c, "id": None} for c in b.message.get("tool_calls") or []]
    assert a.message.get("content") == b.message.get("content")
    assert (a.tokens, a.token_ids, a.margins, a.top2) == (b.tokens, b.token_ids, b.margins, b.top2)
    assert (a.finish_reason, a.prompt_tokens, a.completion_tokens) == (b.finish_reason, b.prompt_tokens,
                                                                     b.completion_tokens)


def test_streaming_equals_non_streaming(tmp_path, setup):
    """Both servers (text content; tool calls with argument deltas), streamed and not: the same answers."""
    paths = load_paths(audit_paths(tmp_path, setup))
    reqs = requests(3)
    answers = {}
    for name in ("http-tiny", "http-echo"):
        for stream in (False, True):
            engine = make_engine(replace(paths[name], options={**paths[name].options, "stream": stream}))
            try:
                answers[name, stream] = engine.generate(reqs)
            finally:
                engine.close()
    for name in ("http-tiny", "http-echo"):
        for plain, streamed in zip(answers[name, False], answers[name, True]):
            assert plain.ok and streamed.ok, (plain.error, streamed.error)
            _same_answer(plain, streamed)
            assert plain.ttft_s == plain.latency_s and 0 < streamed.ttft_s <= streamed.latency_s
    for r in answers["http-echo", True]:
        assert r.finish_reason == "tool_calls" and r.message["content"] is None
        assert r.message["tool_calls"][0]["id"].startswith("call_")
        call = parse_message(r.message).calls[0]
        assert (call.name, call.arguments) == ("get_quote", {"symbol": "AMZN", "limit": 3})
    for r in answers["http-tiny", True]:
        assert "tool_calls" not in r.message and r.message["content"].startswith("<tool_call>")


def metrics(root: str) -> dict[str, float]:
    status, body = get(root + "/metrics")
    assert status == 200
    values: dict[str, float] = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def test_metrics_counters_move_on_the_speculative_path(tmp_path, setup):
    echo, tiny = setup.servers["echo-spec"].root, setup.servers["tiny"].root
    text = get(echo + "/metrics")[1].decode()
    assert "# TYPE vllm:spec_decode_num_drafts_total counter" in text
    before, tiny_before = metrics(echo), metrics(tiny)
    paths = load_paths(audit_paths(tmp_path, setup, concurrency=8, batch_size=8))
    engine = make_engine(paths["http-echo"])
    try:
        results = engine.generate(requests(8))
    finally:
        engine.close()
    assert all(r.ok for r in results)
    after = metrics(echo)

    def delta(name: str) -> float:
        key = f'{name}{{model_name="echo-spec"}}'
        return after.get(key, 0) - before.get(key, 0)

    assert delta("vllm:spec_decode_num_drafts_total") > 0
    assert delta("vllm:spec_decode_num_draft_tokens_total") >= delta("vllm:spec_decode_num_accepted_tokens_total") > 0
    assert delta("vllm:generation_tokens_total") == sum(r.completion_tokens for r in results)
    success = 'vllm:request_success_total{model_name="echo-spec",finished_reason="length"}'
    assert after[success] - before.get(success, 0) == 8
    assert delta("toolaudit:engine_batch_requests_total") == 8  # batch_size 1: one engine call each
    assert delta("toolaudit:engine_batches_total") == 8
    # the target-only path drafts nothing
    assert metrics(tiny)['vllm:spec_decode_num_draft_tokens_total{model_name="tiny"}'] == 0
    assert tiny_before['vllm:spec_decode_num_draft_tokens_total{model_name="tiny"}'] == 0


MESSAGES = [{"role": "user", "content": "What is the price of AMZN?"}]


@pytest.mark.parametrize("body, status, param, code", [
    (b"{not json", 400, None, None),
    ([1, 2], 400, None, None),
    ({"messages": MESSAGES}, 400, "model", None),
    ({"model": "gpt-nope", "messages": MESSAGES}, 404, "model", "model_not_found"),
    ({"model": "tiny", "messages": []}, 400, "messages", None),
    ({"model": "tiny", "messages": [{"content": "no role"}]}, 400, "messages[0]", None),
    ({"model": "tiny", "messages": MESSAGES, "tools": [{"type": "function"}]}, 400, "tools[0]", None),
    ({"model": "tiny", "messages": MESSAGES, "temperature": 3}, 400, "temperature", None),
    ({"model": "tiny", "messages": MESSAGES, "max_tokens": 0}, 400, "max_tokens", None),
    ({"model": "tiny", "messages": MESSAGES, "n": 0}, 400, "n", None),
    ({"model": "tiny", "messages": MESSAGES, "top_p": 0}, 400, "top_p", None),
    ({"model": "tiny", "messages": MESSAGES, "top_logprobs": 2}, 400, "top_logprobs", None),
    ({"model": "tiny", "messages": MESSAGES, "stream_options": {"include_usage": True}}, 400, "stream_options",
     None),
    ({"model": "tiny", "messages": MESSAGES, "tool_choice": {"type": "function", "function": {"name": "x"}}},
     400, "tool_choice", "unsupported_value"),
    ({"model": "tiny", "messages": MESSAGES, "max_tokens": 4000}, 400, "messages", "context_length_exceeded"),
])
def test_bad_requests_get_openai_error_shapes(setup, body, status, param, code):
    got, raw = post(setup.servers["tiny"].base_url + "/chat/completions", body)
    assert got == status
    error = json.loads(raw)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["type"] == "invalid_request_error"
    assert (error["param"], error["code"]) == (param, code)


def test_routes_health_models_and_unknown(setup):
    root = setup.servers["tiny"].root
    status, body = get(root + "/v1/models")
    assert status == 200 and json.loads(body)["data"][0]["id"] == "tiny"
    status, body = get(root + "/v1/nothing")
    assert status == 404 and json.loads(body)["error"]["type"] == "not_found_error"
    status, body = get(root + "/v1/chat/completions")  # GET on a POST route
    assert status == 405 and json.loads(body)["error"]["message"].startswith("Method Not Allowed")
    status, body = post(root + "/v1/chat/completions", {"model": "tiny", "messages": MESSAGES, "max_tokens": 2})
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 2
    assert 'toolaudit:http_requests_total{model_name="tiny",code="404",route="other"}' in metrics(root)


def test_serve_cli_errors(tmp_path, setup):
    from click.testing import CliRunner

    from toolaudit.cli import cli

    paths = audit_paths(tmp_path, setup)
    runner = CliRunner()
    result = runner.invoke(cli, ["serve", "--paths", str(paths), "--path", "nope"])
    assert result.exit_code == 2 and "unknown decode path 'nope'" in result.output
    result = runner.invoke(cli, ["serve", "--paths", str(paths), "--path", "http-tiny"])
    assert result.exit_code == 1 and ("paths.http-tiny: serve runs in-process engines (hf, torch, vllm); engine "
                                      "'openai' paths are served elsewhere") in result.output
    port = setup.servers["tiny"].base_url.rsplit(":", 1)[1].split("/")[0]
    result = runner.invoke(cli, ["serve", "--paths", str(paths), "--path", "tiny", "--port", port])
    assert result.exit_code == 1 and f"cannot listen on 127.0.0.1:{port}" in result.output


# ---------------------------------------------------------------------------------------------- batching

class _IdEngine(Engine):
    """A stand-in in-process engine: answers each request with a tool call echoing its last message, and records
    the size of every engine call, so routing under batching can be checked exactly."""

    name = "torch"  # serves the path below, which names the torch engine
    capabilities = Capabilities(in_process=True, decodes_tokens=True)
    batches: ClassVar[list[int]] = []

    def decode_tokens(self, ids, keep_special=False):
        return f"<{ids[0]}>"

    def path_components(self):
        return {"engine": "fake", "max_tokens": self.path.max_tokens}

    def generate(self, reqs):
        self.batches.append(len(reqs))
        time.sleep(0.02)  # an engine call takes time, so requests queue up behind it
        return [EngineResult(key=r.key, finish_reason="stop", prompt_tokens=7, completion_tokens=2,
                             text="<tool_call>\n" + json.dumps({"name": "echo", "arguments": {
                                 "id": r.messages[-1]["content"]}}) + "\n</tool_call>",
                             token_ids=[11, 12], top2=[(11, 13), (12, 14)], margins=[0.5, 0.25]) for r in reqs]


def test_batched_requests_each_get_their_own_result(tmp_path):
    from toolaudit.engines.paths import PathConfig
    from toolaudit.serve.app import EngineHost, build_app
    from toolaudit.serve.metrics import Metrics

    path = PathConfig(name="fake", model="fake-model", batch_size=4)
    host = EngineHost(path, Metrics("fake"), 0.005, engine_factory=_IdEngine)
    app_thread = AppThread(build_app(path, host), on_start=(host.start(),))
    try:
        client_path = load_paths(_write(tmp_path, openai_path_toml(
            "client", app_thread.base_url, "fake", batch_size=64, concurrency=32, logprobs=True,
            extra_body=TOKEN_IDS)))["client"]
        engine = make_engine(client_path)
        reqs = [EngineRequest(f"k{i}", [{"role": "user", "content": f"request-{i}"}], []) for i in range(64)]
        results = engine.generate(reqs)
        engine.close()
    finally:
        app_thread.close()
        host.close()
    for i, r in enumerate(results):
        assert r.ok, r.error
        assert parse_message(r.message).calls[0].arguments == {"id": f"request-{i}"}
        assert (r.token_ids, r.top2, r.margins) == ([11, 12], [(11, 13), (12, 14)], [0.5, 0.25])
        assert r.tokens == []  # token_id:N tokens became ids
    assert sum(_IdEngine.batches) == 64 and max(_IdEngine.batches) == 4 and len(_IdEngine.batches) < 64
    assert re.fullmatch(r"fp-[0-9a-f]{16}", results[0].system_fingerprint)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "client.toml"
    path.write_text(text)
    return path
