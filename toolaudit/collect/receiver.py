"""`toolaudit collect`: an OTLP/HTTP trace receiver, so a team points its OTel exporter or collector (or the
Langfuse SDK) at toolaudit and gets the model calls of its production traffic as OTLP/JSON files to replay.

Routes: `POST /v1/traces`, `POST /api/public/otel/v1/traces` (Langfuse's OTLP path) and `POST /v1/logs` (call
content sent as GenAI log records, e.g. by the official OpenAI instrumentation's event mode). Bodies
`application/x-protobuf` or `application/json`, `Content-Encoding: gzip` or `deflate` (aiohttp decompresses;
the size limit applies to the decompressed body). Answers follow the OTLP/HTTP spec: 200 with an
`ExportTraceServiceResponse` (`ExportLogsServiceResponse`) in the request's encoding (`partial_success`
counting rejected spans or log records: those without usable trace or span ids), 400 with a google.rpc.Status
for an unreadable body, 413 over the size limit, 415 for another content type, 405 for another method, 503
when the disk write fails (exporters retry).

With a token (`collect --token-env VAR`), every request must carry `Authorization: Bearer <token>` (OTLP
exporters send configured headers: `OTEL_EXPORTER_OTLP_HEADERS`), checked before the body is read, in constant
time (`hmac.compare_digest` of SHA-256 digests, so neither the content nor the length of the token leaks through
timing); any other request is answered 401 with a google.rpc.Status (code 16, UNAUTHENTICATED) and
`WWW-Authenticate: Bearer`, and nothing of it is read or written. The token lives in this process only: it is
never written to the files, printed, or put in an answer.

A request's model-call spans and GenAI log records (`keep.py`) are on disk, fsynced, before the 200
(`store.py`), as `{"resourceSpans": ...}` and `{"resourceLogs": ...}` lines of the same hourly files (the
`otel` reader joins the records to their spans); other spans and records are dropped and counted. Request
headers are never stored (Authorization and other secrets stay out of the files): only the spans and records
are.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import signal
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import orjson
from aiohttp import web

from toolaudit import ConfigError
from toolaudit.collect.files import CollectedFiles
from toolaudit.collect.keep import Kept, keep_genai_logs, keep_llm_spans
from toolaudit.collect.otlp_json import (
    JSON,
    LOGS,
    PROTOBUF,
    TRACES,
    BadPayload,
    Signal,
    decode_request,
    export_response,
    proto_classes,
    status_body,
)

MAX_BODY = 32 << 20
TRACE_ROUTES = ("/v1/traces", "/api/public/otel/v1/traces")
LOG_ROUTES = ("/v1/logs",)
INVALID_ARGUMENT, RESOURCE_EXHAUSTED, UNAVAILABLE, UNAUTHENTICATED = 3, 8, 14, 16  # google.rpc.Code


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps the receiver on this machine (localhost, 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class BearerCheck:
    """`Authorization: Bearer <token>` against the one token, in constant time. Only the token's SHA-256 digest is
    held (and compared: equal lengths, so the comparison time tells nothing about the token's length)."""

    def __init__(self, token: str):
        self._digest = hashlib.sha256(token.strip().encode("utf-8", "surrogateescape")).digest()

    def allows(self, header: str | None) -> bool:
        scheme, _, credential = (header or "").strip().partition(" ")
        given = hashlib.sha256(credential.strip().encode("utf-8", "surrogateescape")).digest()
        return hmac.compare_digest(given, self._digest) & (scheme.lower() == "bearer")


@dataclass
class Counts:
    """What the receiver has done since it started (printed when it stops)."""

    requests: int = 0
    kept: int = 0
    dropped: int = 0
    rejected: int = 0
    refused: int = 0  # requests answered 4xx/5xx
    logs_kept: int = 0
    logs_dropped: int = 0
    logs_rejected: int = 0

    def add(self, signal: Signal, kept: Kept) -> None:
        self.requests += 1
        if signal is LOGS:
            self.logs_kept += kept.kept
            self.logs_dropped += kept.dropped
            self.logs_rejected += kept.rejected
        else:
            self.kept += kept.kept
            self.dropped += kept.dropped
            self.rejected += kept.rejected

    def line(self) -> str:
        logs = (f"; {self.logs_kept} log records kept, {self.logs_dropped} dropped, {self.logs_rejected} rejected"
                if self.logs_kept or self.logs_dropped or self.logs_rejected else "")
        return (f"{self.requests} requests: {self.kept} spans kept, {self.dropped} dropped (not model calls), "
                f"{self.rejected} rejected{logs}; {self.refused} requests refused")


def build_app(files: CollectedFiles, max_body: int = MAX_BODY, counts: Counts | None = None,
              token: str | None = None) -> web.Application:
    """The receiver as an aiohttp application (writes go to one worker thread, in arrival order); with `token`,
    only requests bearing it are served (401 otherwise, before anything is read)."""
    counts = counts if counts is not None else Counts()
    bearer = BearerCheck(token) if token is not None else None
    writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="collect-writer")

    def failure(status: int, encoding: str, code: int, message: str) -> web.Response:
        counts.refused += 1
        return web.Response(status=status, body=status_body(encoding, code, message),
                            content_type=encoding if encoding in (JSON, PROTOBUF) else JSON)

    async def receive(signal: Signal, request: web.Request) -> web.Response:
        encoding = request.content_type
        if encoding not in (PROTOBUF, JSON):
            counts.refused += 1
            return web.Response(status=415, text=f"unsupported content type {encoding!r}: send {PROTOBUF} or "
                                                 f"{JSON}")
        too_big = f"the request body is over the limit of {max_body} bytes"
        if request.content_length is not None and request.content_length > max_body:
            return failure(413, encoding, RESOURCE_EXHAUSTED, too_big)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return failure(413, encoding, RESOURCE_EXHAUSTED, too_big)
        loop = asyncio.get_running_loop()
        try:  # parsing a big body takes a while: off the event loop, so other exporters are still answered
            kept, line = await loop.run_in_executor(None, _prepare, body, encoding, signal)
        except BadPayload as exc:
            return failure(400, encoding, INVALID_ARGUMENT, str(exc))
        if line is not None:
            try:
                await loop.run_in_executor(writer, files.append, line)
            except OSError as exc:
                return failure(503, encoding, UNAVAILABLE, f"the {signal.items} could not be stored: {exc}")
        counts.add(signal, kept)
        return web.Response(body=export_response(encoding, kept.rejected, kept.message, signal),
                            content_type=encoding)

    async def traces(request: web.Request) -> web.Response:
        return await receive(TRACES, request)

    async def logs(request: web.Request) -> web.Response:
        return await receive(LOGS, request)

    async def stop_writer(app: web.Application) -> None:
        writer.shutdown(wait=True)

    @web.middleware
    async def authenticate(request: web.Request, handler) -> web.StreamResponse:
        if bearer is not None and not bearer.allows(request.headers.get("Authorization")):
            counts.refused += 1
            encoding = request.content_type if request.content_type in (JSON, PROTOBUF) else JSON
            return web.Response(status=401, body=status_body(encoding, UNAUTHENTICATED, "a valid bearer token is "
                                                             "required (Authorization: Bearer <token>)"),
                                content_type=encoding, headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    app = web.Application(client_max_size=max_body, middlewares=[authenticate])
    for route in TRACE_ROUTES:
        app.router.add_post(route, traces)
    for route in LOG_ROUTES:
        app.router.add_post(route, logs)
    app.on_cleanup.append(stop_writer)
    return app


def _prepare(body: bytes, encoding: str, signal: Signal) -> tuple[Kept, bytes | None]:
    """The request's kept items and the line to store (None: nothing kept); BadPayload for an unreadable body."""
    request = decode_request(body, encoding, signal)
    kept = keep_genai_logs(request) if signal is LOGS else keep_llm_spans(request)
    return kept, None if kept.request is None else orjson.dumps(kept.request)


def collect(folder: str | Path, host: str = "127.0.0.1", port: int = 4318, max_body: int = MAX_BODY,
            say: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True),
            token: str | None = None) -> Counts:
    """Receive until SIGINT/SIGTERM; announce the bound address at once (`port=0` picks a free port); with
    `token`, only requests bearing it. Raises ConfigError when opentelemetry-proto is missing, the token is empty,
    the folder is taken or the port cannot be bound."""
    if token is not None and not token.strip():
        raise ConfigError("the bearer token is empty")
    proto_classes(TRACES)
    proto_classes(LOGS)
    files = CollectedFiles(folder)
    try:
        if files.truncated:
            say(f"toolaudit collect: cut a torn last line (an interrupted write) off {', '.join(files.truncated)}")
        return asyncio.run(_collect(files, host, port, max_body, say, token))
    finally:
        files.close()


async def _collect(files: CollectedFiles, host: str, port: int, max_body: int, say: Callable[[str], None],
                   token: str | None = None) -> Counts:
    counts = Counts()
    runner = web.AppRunner(build_app(files, max_body, counts, token), access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        await runner.cleanup()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):  # before the address is announced: a stop right after it is clean
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    if token is None and not is_loopback(host):  # before the address too, so whoever waits on that has seen it
        say(f"toolaudit collect: warning: listening on {host} beyond loopback with no token: anyone who reaches it "
            f"can write spans into the collected sample (give one with --token-env VAR)")
    bound = runner.addresses[0]
    shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
    say(f"toolaudit collect: listening on http://{shown}:{bound[1]} (POST {TRACE_ROUTES[0]}, {LOG_ROUTES[0]}), "
        f"writing to {files.folder}{'; requests need the bearer token' if token is not None else ''}")
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
    say(f"toolaudit collect: stopped; {counts.line()}")
    return counts
