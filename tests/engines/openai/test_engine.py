"""The openai engine against a misbehaving loopback stub (aiohttp, in-process): 429s, 500s, stalls past the
timeout, reset connections, truncated and broken JSON, a 400, an error that echoes the API key. The run must
complete, record what still fails after the retries as error rows, and a resumed run must fill exactly those
in once the server behaves. The key given through `api_key_env` must appear nowhere on disk.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import secrets
from collections import Counter
from pathlib import Path

import pytest
from aiohttp import web
from click.testing import CliRunner
from helpers import DEMO, REPO, AppThread, openai_path_toml

from toolaudit.cli import cli
from toolaudit.engines import EngineRequest, make_engine
from toolaudit.engines.openai.engine import backoff_delay
from toolaudit.engines.paths import load_paths, parse_path
from toolaudit.replay.replayer import ReplayOptions, load_calls, replay_traces
from toolaudit.store import Store

KEY_ENV = "TOOLAUDIT_TEST_API_KEY"
LIMIT = 20
MAX_RETRIES = 2
# The client's timeout: 5x the 0.4 s this test had when it failed once on a loaded machine, so only a stall (which
# waits for the stub's release, not on a clock) ends in it.
TIMEOUT_S = 2.0
# fault per call, round-robin in call order; "*-once" faults fail the first attempt only
FAULTS = ("ok", "429-once", "500", "stall", "reset", "truncated", "badjson", "400", "leak", "500-once")
ALWAYS = {"500", "stall", "reset", "truncated", "badjson", "leak"}  # fail every attempt while the stub is faulty
EXPECTED_ERROR = {"500": "HTTP 500: overloaded", "stall": f"timeout: no complete response within {TIMEOUT_S:g}s",
                  "reset": "connection error", "truncated": "connection error", "badjson": "malformed response",
                  "400": "HTTP 400: bad field", "leak": "HTTP 500: upstream rejected key ***"}


def digest(messages: list) -> str:
    return hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()[:16]


class Stub:
    """A Chat Completions endpoint that misbehaves on purpose until `healthy` is set. Answers a tool call whose
    `limit` argument is 5, or 6 for speculative requests of "ok" calls (so the replay sees some drift)."""

    def __init__(self, key: str, faults: dict[str, str]):
        self.key, self.faults, self.healthy = key, faults, False
        self.unstalled = asyncio.Event()  # set at teardown, so no stalled handler outlives the test
        self.attempts: Counter = Counter()  # (digest, stream) -> attempts

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {self.key}":
            return web.json_response({"error": {"message": "bad key", "type": "auth", "param": None,
                                                "code": None}}, status=401)
        body = await request.json()
        d = digest(body["messages"])
        stream = bool(body.get("stream"))
        self.attempts[d, stream] += 1
        if body["messages"][-1].get("content") == "say the key":  # a server that echoes the key in its answer
            return web.json_response({"choices": [{"index": 0, "finish_reason": "stop", "message": {
                "role": "assistant", "content": f"your key is {self.key}"}}]})
        fault = "ok" if self.healthy else self.faults.get(d, "ok")
        first = self.attempts[d, stream] == 1
        if fault == "429-once" and first:
            return web.json_response({"error": {"message": "slow down"}}, status=429, headers={"Retry-After": "0"})
        if fault == "500-once" and first or fault == "500":
            return web.json_response({"error": {"message": "overloaded"}}, status=500)
        if fault == "leak":
            return web.json_response({"error": {"message": f"upstream rejected key {self.key}"}}, status=500)
        if fault == "400":
            return web.json_response({"error": {"message": "bad field", "param": "x"}}, status=400)
        if fault == "stall":  # held until the stub is healthy or closed: the client's timeout_s ends it
            await self.unstalled.wait()
        if fault == "reset":
            request.transport.abort()
            return web.Response()
        spec = bool(body.get("speculative"))
        limit = 6 if spec and self.faults.get(d) == "ok" else 5
        args = json.dumps({"symbol": "AMZN", "limit": limit})
        if fault == "badjson":
            return web.Response(body=b'{"id": "x", "choices": [', content_type="application/json")
        if not stream:
            data = json.dumps(self.completion(args, body)).encode()
            if fault == "truncated":  # Content-Length promises more than arrives, then the connection drops
                response = web.StreamResponse(headers={"Content-Type": "application/json",
                                                       "Content-Length": str(len(data))})
                await response.prepare(request)
                await response.write(data[: len(data) // 2])
                request.transport.abort()
                return response
            return web.Response(body=data, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i, chunk in enumerate(self.chunks(args, body)):
            if fault == "truncated" and i == 2:
                request.transport.abort()
                return response
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    @staticmethod
    def logprobs(args: str) -> list[dict]:
        return [{"token": ch, "logprob": -0.1, "top_logprobs": [{"token": ch, "logprob": -0.1},
                                                                {"token": "?", "logprob": -2.6}]} for ch in args]

    def completion(self, args: str, body: dict) -> dict:
        return {"id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                "system_fingerprint": "fp_stub",
                "choices": [{"index": 0, "finish_reason": "tool_calls",
                             "message": {"role": "assistant", "content": None, "tool_calls": [
                                 {"id": "call_1", "type": "function",
                                  "function": {"name": "get_quote", "arguments": args}}]},
                             "logprobs": {"content": self.logprobs(args)} if body.get("logprobs") else None}],
                "usage": {"prompt_tokens": 50, "completion_tokens": len(args), "total_tokens": 50 + len(args)}}

    def chunks(self, args: str, body: dict) -> list[dict]:
        def chunk(delta, finish=None, lp=None):
            return {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": body["model"],
                    "system_fingerprint": "fp_stub", "choices": [
                        {"index": 0, "delta": delta, "finish_reason": finish,
                         "logprobs": {"content": lp} if lp else None}]}

        out = [chunk({"role": "assistant", "content": None}),
               chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                      "function": {"name": "get_quote", "arguments": ""}}]})]
        lp = self.logprobs(args) if body.get("logprobs") else [None] * len(args)
        for i in range(0, len(args), 5):
            out.append(chunk({"tool_calls": [{"index": 0, "function": {"arguments": args[i: i + 5]}}]},
                             lp=[e for e in lp[i: i + 5] if e]))
        out.append(chunk({}, finish="tool_calls"))
        out.append({"id": "c", "object": "chat.completion.chunk", "created": 0, "model": body["model"],
                    "choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": len(args),
                                             "total_tokens": 50 + len(args)}})
        return out


@pytest.fixture
def key(monkeypatch) -> str:
    value = "sk-test-" + secrets.token_hex(16)
    monkeypatch.setenv(KEY_ENV, value)
    return value


@pytest.fixture
def calls():
    found, _, _ = load_calls(ReplayOptions(traces=[str(DEMO)], limit=LIMIT))
    return found


@pytest.fixture
def stub(key, calls):
    faults: dict[str, str] = {}
    for i, c in enumerate(calls):
        faults.setdefault(digest(c.request["messages"]), FAULTS[i % len(FAULTS)])
    server = Stub(key, faults)
    thread = AppThread(server.app())
    server.base_url = thread.base_url
    yield server
    thread.loop.call_soon_threadsafe(server.unstalled.set)
    thread.close()


def stub_paths(tmp_path: Path, base_url: str) -> Path:
    common = {"api_key_env": KEY_ENV, "max_retries": MAX_RETRIES, "timeout_s": TIMEOUT_S, "backoff_s": 0.01,
              "backoff_max_s": 0.05, "logprobs": True, "batch_size": 8, "concurrency": 4}
    text = openai_path_toml("stub", base_url, "stub-model", **common)
    text += openai_path_toml("stub-spec", base_url, "stub-model", stream=True,
                             extra_body="{ speculative = true }", **common)
    path = tmp_path / "paths.toml"
    path.write_text(text)
    return path


def test_faulty_endpoint_run_completes_and_resume_fills_the_failures(tmp_path, key, calls, stub):
    db = tmp_path / "audit.duckdb"
    options = ReplayOptions(traces=[str(DEMO)], baseline="stub", candidate="stub-spec",
                            paths_file=str(stub_paths(tmp_path, stub.base_url)), limit=LIMIT,
                            schema_dir=str(REPO / "schemas"))
    fault_of = [stub.faults[digest(c.request["messages"])] for c in calls]
    assert len(stub.faults) == LIMIT  # every call's messages differ, so attempts count per call
    failing = sum(1 for f in fault_of if f in ALWAYS or f == "400")
    with Store(db) as store:
        run_id, counts = replay_traces(store, options)
        assert (counts.calls, counts.replayed, counts.errors) == (LIMIT, LIMIT, failing)
        rows = store.rows("""SELECT c.session_id, c.call_index, c.match_status, o.side, o.error
                             FROM calls c JOIN outputs o USING (run_id, session_id, call_index)
                             WHERE run_id = ? ORDER BY c.session_id, c.call_index, o.side""", [run_id])
        assert len(rows) == 2 * LIMIT
        by_call = {(c.session_id, c.call_index): f for c, f in zip(calls, fault_of)}
        for row in rows:
            fault = by_call[row["session_id"], row["call_index"]]
            if fault in EXPECTED_ERROR:
                assert row["match_status"] == "error", (fault, row)
                assert (row["error"] or "").startswith(EXPECTED_ERROR[fault]), (fault, row)
                if fault == "400":  # not retryable
                    assert "attempts" not in row["error"]
                else:
                    assert row["error"].endswith(f"(after {MAX_RETRIES + 1} attempts)"), row
            else:
                assert row["match_status"] == "matched" and row["error"] is None, row
        drifted = store.query("SELECT count(*) FROM calls WHERE run_id = ? AND drift_kind = 'arguments_changed'",
                              [run_id])[1][0][0]
        assert drifted == fault_of.count("ok")  # the candidate's limit 6 vs 5, seen through tool_calls
        divergence = store.rows("SELECT * FROM calls WHERE run_id = ? AND drifted", [run_id])[0]
        # token strings from logprobs place the divergence: '{"symbol": "AMZN", "limit": ' is 28 characters
        assert (divergence["first_divergence"], divergence["baseline_token"], divergence["candidate_token"]) == \
            (28, "5", "6")
        assert divergence["baseline_margin"] == pytest.approx(2.5)
        fingerprints = store.query("SELECT DISTINCT system_fingerprint FROM outputs WHERE error IS NULL")[1]
        assert fingerprints == [("fp_stub",)]
    # attempts per request and side: an always-failing one 1 + max_retries times, a 400 once (not retryable),
    # a transient fault twice, a good request once
    for d, fault in stub.faults.items():
        want = {"400": 1, "ok": 1, "429-once": 2, "500-once": 2}.get(fault, MAX_RETRIES + 1)
        assert (stub.attempts[d, False], stub.attempts[d, True]) == (want, want), fault

    for path in db.parent.glob("audit.duckdb*"):  # the error rows hold the scrubbed message, never the key
        assert key.encode() not in path.read_bytes(), path

    stub.healthy = True
    before = Counter(stub.attempts)
    result = CliRunner().invoke(cli, ["replay", "--resume", str(run_id), "--db", str(db), "--json"])
    assert result.exit_code == 0, result.output
    assert key not in result.output
    assert f"{LIMIT - failing} calls already stored, {failing} replayed" in result.output
    # the resume asked again for exactly the calls that had failed, once per side
    for d, fault in stub.faults.items():
        again = 1 if fault in ALWAYS or fault == "400" else 0
        assert (stub.attempts[d, False] - before[d, False], stub.attempts[d, True] - before[d, True]) == \
            (again, again), fault
    with Store(db) as store:
        status = store.query("SELECT match_status, count(*) FROM calls WHERE run_id = ? GROUP BY ALL", [run_id])[1]
        assert status == [("matched", LIMIT)]
        n, distinct = store.query("""SELECT count(*), count(DISTINCT (session_id, call_index, side))
                                     FROM outputs WHERE run_id = ? AND error IS NULL""", [run_id])[1][0]
        assert n == distinct == 2 * LIMIT
        from toolaudit.report import write_reports

        reports = write_reports(store, run_id, None, ["html", "md", "json"], tmp_path / "reports")
    assert reports
    secret = key.encode()
    for path in [db, *db.parent.glob("audit.duckdb*"), *reports]:
        assert secret not in path.read_bytes(), path


def test_engine_results_stay_in_order_with_evidence(tmp_path, key, stub):
    reqs = [EngineRequest(f"k{i}", [{"role": "user", "content": f"hello {i}"}], []) for i in range(6)]
    engine = make_engine(load_paths(stub_paths(tmp_path, stub.base_url))["stub"])
    try:
        results = engine.generate(reqs)
        assert [r.key for r in results] == [r.key for r in reqs] and all(r.ok for r in results)
        assert engine.fingerprint_components()["system_fingerprint"] == "fp_stub"
        assert results[0].tokens[:2] == ['{', '"'] and results[0].margins[0] == pytest.approx(2.5)
    finally:
        engine.close()


def test_a_key_echoed_in_an_answer_is_scrubbed(tmp_path, key, stub):
    engine = make_engine(load_paths(stub_paths(tmp_path, stub.base_url))["stub"])
    try:
        [result] = engine.generate([EngineRequest("k", [{"role": "user", "content": "say the key"}])])
    finally:
        engine.close()
    assert result.text == "your key is ***" and result.message["content"] == "your key is ***"


def test_unreachable_endpoint_is_an_error_row_not_a_crash():
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = parse_path("down", {"engine": "openai", "base_url": f"http://127.0.0.1:{port}/v1", "max_retries": 1,
                               "backoff_s": 0.01, "timeout_s": 2})
    engine = make_engine(path)
    try:
        [result] = engine.generate([EngineRequest("k", [{"role": "user", "content": "hi"}])])
    finally:
        engine.close()
    assert result.error.startswith("connection error") and result.error.endswith("(after 2 attempts)")
    assert "api_key" not in json.dumps(engine.fingerprint_components())


def test_fingerprint_components_never_hold_the_key(key):
    path = parse_path("p", {"engine": "openai", "base_url": "https://api.example.com/v1", "api_key_env": KEY_ENV,
                            "model": "m", "extra_body": {"spec": True}, "tool_choice": "auto"})
    components = make_engine(path).fingerprint_components()
    assert key not in json.dumps(components) and "system_fingerprint" not in components
    assert components["extra_body"] == {"spec": True} and components["base_url"] == "https://api.example.com/v1"
    assert components["sampling"]["temperature"] == 0.0


def test_backoff_is_exponential_with_jitter_and_honours_retry_after():
    rng = random.Random(1)
    for attempt in range(6):
        d = min(8.0, 0.5 * 2 ** attempt)
        delays = [backoff_delay(attempt, 0.5, 8.0, rng=rng) for _ in range(200)]
        assert all(d / 2 <= x <= d for x in delays) and len(set(delays)) > 100  # jittered
    assert backoff_delay(0, 0.5, 8.0, retry_after=3, rng=rng) == 3  # the server's floor
    assert backoff_delay(0, 0.5, 8.0, retry_after=60, rng=rng) == 8.0  # capped


def test_sse_data_reads_events_as_the_spec_frames_them():
    from toolaudit.engines.openai.engine import sse_data

    async def lines():
        for line in [": keep-alive", "", "event: chunk", "data: {\"a\":", "data:1}", "id: 3", "", "", "data: [DONE]"]:
            yield line

    async def collect():
        return [d async for d in sse_data(lines())]

    # comments and other fields skipped, data lines joined, one leading space dropped, an open last event given
    assert asyncio.run(collect()) == ['{"a":\n1}', "[DONE]"]
