"""`toolaudit serve`: an OpenAI-compatible HTTP server around an in-process decode path (any engine whose
capabilities say `in_process`: torch, hf, vllm, or a plug-in), so the whole HTTP decode path (client, server,
tool-call parsing, streaming) can be audited for real on a machine without a GPU.

Routes: `POST /v1/chat/completions` (tools in, `tool_calls` out, `stream` as SSE, `logprobs` from the engine's
top-2 margins: see `api`; an `X-Request-Id` header is echoed and names the completion),
`GET /v1/models`, `GET /health` (503 until the model is loaded) and `GET /metrics` (Prometheus text with vLLM's
spec-decode counter names: see `metrics`).

A request's `max_tokens`, `temperature` and `stop` override the path's (one engine per distinct setting, all on
the same weights; an engine that cannot be held beside another, vLLM, reloads when the settings change);
`system_fingerprint` is the fingerprint of the path as actually run, so it equals the path's own (`/health`)
when a request leaves them alone. `stream: true` sends the finished completion as chunks: engines do not hand
out tokens as they decode, so a time to first token measured through this server equals its latency.

Batching: requests wait in a queue; a collector takes up to the path's `batch_size` of them (waiting
`batch_wait_s` for company when the queue is short), groups them by sampling settings, and runs one
`engine.generate` at a time on a worker thread. Batch composition changes numerics (a batched pass reduces in
another order), so an audit that must equal in-process results uses `batch_size = 1`.
"""

from __future__ import annotations

import asyncio
import re
import signal
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import orjson
from aiohttp import web

from toolaudit import ConfigError
from toolaudit.engines import ENGINES, Engine, make_engine
from toolaudit.engines.base import EngineRequest, EngineResult, error_result
from toolaudit.engines.fingerprint import fingerprint
from toolaudit.engines.paths import PathConfig
from toolaudit.serve.api import (
    ApiError,
    ChatRequest,
    assistant_message,
    completion_body,
    logprobs_content,
    new_completion_id,
    parse_chat_request,
    stream_chunks,
)
from toolaudit.serve.metrics import Metrics

MAX_BODY = 32 << 20  # agent contexts get long
SHUTDOWN_GRACE_S = 10.0
MAX_ENGINES = 32  # distinct (max_tokens, temperature, stop) settings kept at once
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")  # a client's X-Request-Id becomes the completion id (as vLLM)
Settings = tuple  # (max_tokens, temperature, stop): requests that share them can share an engine call


@dataclass
class Served:
    """One request's result with what the response needs from the engine: its fingerprint and token texts."""

    result: EngineResult
    fingerprint: str
    pieces: dict[int, str]


@dataclass
class _Pending:
    settings: Settings
    request: EngineRequest
    future: asyncio.Future


class EngineHost:
    """The served path's engines (one per sampling settings, sharing weights), run one call at a time on one
    worker thread, fed by a batching collector."""

    def __init__(self, path: PathConfig, metrics: Metrics, batch_wait_s: float = 0.005,
                 engine_factory: Callable[[PathConfig], Engine] | None = None):
        self.path, self.metrics, self.batch_wait_s = path, metrics, batch_wait_s
        self.engine_factory = engine_factory or make_engine
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="toolaudit-engine")
        self.engines: dict[Settings, Engine] = {}
        self.fingerprints: dict[Settings, str] = {}
        self.queue: asyncio.Queue[_Pending] | None = None
        self.ready = asyncio.Event()
        self.load_error: str | None = None
        self.fingerprint: str | None = None

    def default_settings(self) -> Settings:
        return (self.path.max_tokens, self.path.temperature, self.path.stop)

    def settings_for(self, req: ChatRequest) -> Settings:
        p = self.path
        return (req.max_tokens or p.max_tokens, p.temperature if req.temperature is None else req.temperature,
                p.stop if req.stop is None else req.stop)

    # -- worker thread ------------------------------------------------------------------------------------
    def _engine(self, settings: Settings) -> Engine:
        engine = self.engines.get(settings)
        if engine is None:
            if len(self.engines) >= MAX_ENGINES:  # clients choose settings: keep the default, drop the oldest
                oldest = next(k for k in self.engines if k != self.default_settings())
                self.engines.pop(oldest).close()
                del self.fingerprints[oldest]
            max_tokens, temperature, stop = settings
            engine = self.engine_factory(replace(self.path, max_tokens=max_tokens, temperature=temperature,
                                                 stop=stop))
            self.engines[settings] = engine
            self.fingerprints[settings] = fingerprint(engine.fingerprint_components())
        if not engine.capabilities.holds_together:  # e.g. vLLM: one loaded at a time
            for other in self.engines.values():
                if other is not engine:
                    other.close()
        engine.load()
        return engine

    def _load(self) -> str:
        self._engine(self.default_settings())
        return self.fingerprints[self.default_settings()]

    def _run(self, settings: Settings, requests: list[EngineRequest]) -> list[Served]:
        engine = self._engine(settings)
        results = engine.generate(requests)
        out = []
        for r in results:
            ids = set(r.token_ids) | {t for pair in r.top2 for t in pair}
            out.append(Served(r, self.fingerprints[settings], {t: _piece(engine, t) for t in ids}))
        return out

    # -- event loop ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Load the model on the worker thread, then start collecting batches. Failures land in `load_error`."""
        loop = asyncio.get_running_loop()
        self.queue = asyncio.Queue()
        try:
            self.fingerprint = await loop.run_in_executor(self.executor, self._load)
        except Exception as exc:  # noqa: BLE001 -- reported by /health and by `serve` itself
            self.load_error = f"{type(exc).__name__}: {exc}"
            self.ready.set()
            return
        self.ready.set()
        await self._collect()

    async def submit(self, settings: Settings, request: EngineRequest) -> Served:
        await self.ready.wait()
        if self.load_error:
            raise ApiError(503, f"the model failed to load: {self.load_error}", "server_error")
        future = asyncio.get_running_loop().create_future()
        await self.queue.put(_Pending(settings, request, future))
        self.metrics.waiting.set(self.queue.qsize())
        return await future

    async def _collect(self) -> None:
        loop = asyncio.get_running_loop()
        size = self.path.batch_size
        while True:
            items = [await self.queue.get()]
            if size > 1 and self.queue.qsize() < size - 1:
                await asyncio.sleep(self.batch_wait_s)  # let requests that arrive together share the call
            while len(items) < size and not self.queue.empty():
                items.append(self.queue.get_nowait())
            self.metrics.waiting.set(self.queue.qsize())
            groups: dict[Settings, list[_Pending]] = {}
            for item in items:
                if not item.future.done():  # a client that went away no longer waits
                    groups.setdefault(item.settings, []).append(item)
            for settings, group in groups.items():
                self.metrics.running.set(len(group))
                self.metrics.batches.inc()
                self.metrics.batch_requests.inc(len(group))
                requests = [g.request for g in group]
                try:
                    served = await loop.run_in_executor(self.executor, self._run, settings, requests)
                except Exception as exc:  # noqa: BLE001 -- the engine's contract says it does not raise; be safe
                    served = [Served(error_result(r.key, exc), "", {}) for r in requests]
                self.metrics.running.set(0)
                for item, s in zip(group, served):
                    self.metrics.record(s.result, self.path.speculative is not None)
                    if not item.future.done():
                        item.future.set_result(s)

    def close(self) -> None:
        """Stop the worker thread (after the call in flight, if any: requests had their grace period), then free
        every engine (models, worker processes)."""
        self.executor.shutdown(wait=True, cancel_futures=True)
        for engine in self.engines.values():
            engine.close()


def _piece(engine: Engine, token: int) -> str:
    """One token's text for logprobs (special tokens included); `token_id:N`, as vLLM writes token ids, from an
    engine that cannot decode ids."""
    if engine.capabilities.decodes_tokens:
        return engine.decode_tokens([token], keep_special=True)
    return f"token_id:{token}"


# ------------------------------------------------------------------------------------------------ HTTP

def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def build_app(path: PathConfig, host: EngineHost) -> web.Application:
    """The aiohttp application serving `path` through `host`."""
    metrics = host.metrics
    served_names = list(dict.fromkeys([path.name, path.model]))

    @web.middleware
    async def errors(request: web.Request, handler: Callable) -> web.StreamResponse:
        route = request.match_info.route.resource.canonical if request.match_info.route.resource else "other"
        try:
            response = await handler(request)
        except ApiError as exc:
            response = _json(exc.body(), exc.status)
        except web.HTTPException as exc:  # unknown route (404), wrong method (405), body too large (413)
            if exc.status < 400:
                raise
            kind = "not_found_error" if exc.status == 404 else "invalid_request_error"
            response = _json(ApiError(exc.status, f"{exc.reason}: {request.method} {request.path}", kind).body(),
                             exc.status)
        except Exception as exc:  # noqa: BLE001 -- a bug answers 500 in the OpenAI shape, the server lives on
            print(f"toolaudit serve: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
            response = _json(ApiError(500, "internal server error", "server_error").body(), 500)
        metrics.http_request(route, response.status)
        return response

    async def chat(request: web.Request) -> web.StreamResponse:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            raise ApiError(400, f"could not parse the JSON body: {exc}") from None
        req = parse_chat_request(body, served_names)
        request_id = request.headers.get("X-Request-Id", "")
        cid = ("chatcmpl-" + request_id) if _REQUEST_ID.fullmatch(request_id) else new_completion_id()
        key = f"seed:{req.seed}" if req.seed is not None else cid  # seeds a sampled request reproducibly
        served = await host.submit(host.settings_for(req), EngineRequest(key, req.messages, req.tools))
        result = served.result
        if result.error:
            if "exceeds the model's" in result.error:
                raise ApiError(400, result.error, param="messages", code="context_length_exceeded")
            raise ApiError(500, f"the engine failed: {result.error}", "server_error")
        created = int(time.time())
        message, finish = assistant_message(result, cid)
        logprobs = (logprobs_content(result, served.pieces.__getitem__, req.top_logprobs, req.tokens_as_ids)
                    if req.logprobs else None)
        echo = {"X-Request-Id": request_id} if request_id else {}
        if not req.stream:
            response = _json(completion_body(cid, created, req.model, served.fingerprint, message, finish,
                                             logprobs, result))
            response.headers.update(echo)
            return response
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                               **echo})
        await response.prepare(request)
        try:
            for chunk in stream_chunks(cid, created, req.model, served.fingerprint, message, finish, logprobs,
                                       result, req.include_usage):
                await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionError:  # the client went away mid-stream: nothing left to tell it
            pass
        return response

    async def models(request: web.Request) -> web.Response:
        return _json({"object": "list", "data": [{"id": path.name, "object": "model", "created": 0,
                                                  "owned_by": "toolaudit", "root": path.model}]})

    async def health(request: web.Request) -> web.Response:
        if not host.ready.is_set():
            return _json({"status": "loading", "path": path.name}, 503)
        if host.load_error:
            return _json({"status": "error", "path": path.name, "error": host.load_error}, 503)
        return _json({"status": "ok", "path": path.name, "fingerprint": host.fingerprint})

    async def prometheus(request: web.Request) -> web.Response:
        return web.Response(text=metrics.render(), content_type="text/plain", charset="utf-8",
                            headers={"X-Content-Type-Options": "nosniff"})

    app = web.Application(middlewares=[errors], client_max_size=MAX_BODY)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", prometheus)
    return app


def check_servable(path: PathConfig) -> None:
    """Fail fast (before binding a port) on a path the server cannot run: its engine must run in process, and
    what it checks without loading (model files, options) must hold."""
    spec = ENGINES.spec(path.engine, f"paths.{path.name}")
    if not spec.capabilities.in_process:
        in_process = ", ".join(name for name, s in ENGINES.items() if s.capabilities.in_process)
        raise ConfigError(f"paths.{path.name}: serve runs in-process engines ({in_process}); engine "
                          f"{path.engine!r} paths are served elsewhere (point an openai path at them instead)")
    make_engine(path).check()


def serve(path: PathConfig, host: str = "127.0.0.1", port: int = 8000, batch_wait_s: float = 0.005,
          say: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)) -> None:
    """Serve `path` until SIGINT/SIGTERM. Announces the bound address at once (`port=0` picks a free port), and
    readiness once the model is loaded. Raises `ConfigError` when the port cannot be bound or the model fails."""
    check_servable(path)
    asyncio.run(_serve(path, host, port, batch_wait_s, say))


async def _serve(path: PathConfig, host: str, port: int, batch_wait_s: float, say: Callable[[str], None]) -> None:
    engine_host = EngineHost(path, Metrics(path.name), batch_wait_s)
    runner = web.AppRunner(build_app(path, engine_host), access_log=None, handle_signals=False,
                           shutdown_timeout=SHUTDOWN_GRACE_S)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    bound = runner.addresses[0]
    shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
    say(f"toolaudit serve: path {path.name!r} listening on http://{shown}:{bound[1]}/v1 (loading the model)")
    if host not in ("127.0.0.1", "localhost", "::1"):
        say("toolaudit serve: warning: listening beyond loopback, with no authentication")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread, or no signals on this platform
            pass
    worker = asyncio.create_task(engine_host.start())
    stopper = asyncio.create_task(stop.wait())
    try:
        loading = asyncio.create_task(engine_host.ready.wait())
        await asyncio.wait([loading, stopper], return_when=asyncio.FIRST_COMPLETED)
        loading.cancel()
        if stop.is_set():
            return
        if engine_host.load_error:
            raise ConfigError(f"paths.{path.name}: the model failed to load: {engine_host.load_error}")
        say(f"toolaudit serve: ready (fingerprint {engine_host.fingerprint}, batch_size {path.batch_size})")
        await asyncio.wait([worker, stopper], return_when=asyncio.FIRST_COMPLETED)
        if worker.done() and worker.exception():
            raise worker.exception()
    finally:
        await runner.cleanup()  # stop accepting; requests in flight get SHUTDOWN_GRACE_S to finish
        for task in (worker, stopper):
            task.cancel()
        engine_host.close()
    say("toolaudit serve: stopped")
