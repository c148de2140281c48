"""The HTTP engine: replays requests against any OpenAI-compatible Chat Completions endpoint.

Production decodes behind vLLM, SGLang or a gateway; an audit must traverse that same path, so this engine sends
the recorded `messages` and `tools` as they are and reads the tool calls from the response's `tool_calls` field.
Baseline and candidate may be two endpoints, or one endpoint with a different `extra_body` (e.g. a gateway's
speculative-decoding switch).

Client behaviour: the real `openai` package (`AsyncOpenAI`, its own retries off), at most `concurrency` requests
in flight, a per-attempt deadline of `timeout_s`, and our own retry loop (exponential backoff with jitter, a
server's Retry-After as a floor) on 429, 408/409, 5xx, connection errors, timeouts and truncated bodies. A streamed
answer counts only once `data: [DONE]` arrives (a cut stream can end the body cleanly and look whole). A request
that still fails becomes an error result with the status and message; `replay --resume` retries those calls.
docs/reliability.md lists the faults this is tested against.

The API key is read from the environment variable NAMED by `api_key_env`; `extra_headers` values (inline or read
from a variable) are sent with every request. Both are held by the client only and scrubbed (`Scrubber`) from
error messages and answers, so a server that echoes them does not get them stored: they never reach the
database, reports or logs. Loopback servers need no key, nor does a path that authenticates with extra_headers.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import os
import random
import re
import sys
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import orjson

from toolaudit import ConfigError

from ..base import Engine, EngineRequest, EngineResult
from ..paths import PathConfig
from .config import CAPABILITIES, OpenAIOptions, options_for
from .shapes import StreamAggregate, openai_messages, openai_tools, result_from_response

_DUMMY_KEY = "EMPTY"  # what vLLM's docs use for servers without authentication
_RETRY_STATUS = frozenset({408, 409, 429})
# Secrets shorter than this are not scrubbed from answers: they cannot be keys, and replacing e.g. a tenant id
# "7" in every answer would corrupt the outputs being compared.
MIN_SCRUBBED = 8


def is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def api_key(path: PathConfig, opts: OpenAIOptions) -> str:
    """The key from the environment variable `api_key_env` names; a dummy for loopback servers without one."""
    if opts.api_key_env:
        key = os.environ.get(opts.api_key_env)
        if not key:
            raise ConfigError(f"paths.{path.name}: api_key_env names ${opts.api_key_env}, which is not set "
                              f"(export it before running)")
        return key
    if is_loopback(opts.base_url) or opts.extra_headers:
        return _DUMMY_KEY
    raise ConfigError(f"paths.{path.name}: api_key_env is required for {urlsplit(opts.base_url).hostname} "
                      f"(the NAME of the environment variable holding the key; only loopback servers and paths "
                      f"that authenticate with extra_headers need none)")


def header_values(path: PathConfig, opts: OpenAIOptions) -> dict[str, str]:
    """`extra_headers` with each `{ env = NAME, prefix = P }` as P + the variable's value (an unset one is a
    ConfigError)."""
    values = {}
    for name, value in opts.extra_headers.items():
        if isinstance(value, dict):
            secret = os.environ.get(value["env"])
            if not secret:
                raise ConfigError(f"paths.{path.name}: extra_headers.{name} names ${value['env']}, which is not "
                                  f"set (export it before running)")
            if not secret.isascii() or not secret.isprintable():  # httpx would echo it in its error
                raise ConfigError(f"paths.{path.name}: extra_headers.{name}: ${value['env']} must hold printable "
                                  f"ASCII (no line breaks or control characters)")
            value = value.get("prefix", "") + secret
        values[name] = value
    return values


class Scrubber:
    """Replaces known secret values in text with `***`: each value, the credential after an auth scheme
    ("Bearer KEY" -> KEY too), and their URL-encoded and base64 forms (how servers and proxies echo them)."""

    def __init__(self, secrets: list[str]):
        forms: set[str] = set()
        for secret in secrets:
            parts = secret.split(" ", 1)
            for value in (secret, parts[1].strip() if len(parts) == 2 else ""):
                if len(value) >= MIN_SCRUBBED:
                    forms |= {value, quote(value, safe=""), base64.b64encode(value.encode()).decode()}
        self.forms = sorted(forms, key=len, reverse=True)  # longest first: a value inside another goes with it

    def __bool__(self) -> bool:
        return bool(self.forms)

    def finds(self, value: Any) -> bool:
        """Whether any string inside `value` (nested dicts and lists) holds a secret: most answers hold none,
        and are then kept as they are rather than rebuilt."""
        if isinstance(value, str):
            return any(form in value for form in self.forms)
        if isinstance(value, dict):
            return any(self.finds(v) for v in value.values())
        if isinstance(value, list):
            return any(self.finds(v) for v in value)
        return False

    def __call__(self, text: str) -> str:
        for form in self.forms:
            if form in text:
                text = text.replace(form, "***")
        return text


def backoff_delay(attempt: int, base: float, cap: float, retry_after: float | None = None,
                  rng: random.Random | None = None) -> float:
    """Seconds to wait before retry `attempt` (0 = first retry): "equal jitter" exponential backoff, i.e. a
    uniform draw in [d/2, d] with d = min(cap, base * 2**attempt). A server's Retry-After (capped) is a floor."""
    d = min(cap, base * 2 ** attempt)
    delay = d / 2 + (rng or random).uniform(0, d / 2)
    if retry_after is not None:
        delay = max(delay, min(retry_after, cap))
    return delay


@dataclass
class _Failure:
    """One failed attempt: what to record, whether to try again, and how long the server asked us to wait."""

    message: str
    retryable: bool
    retry_after: float | None = None


def classify(exc: BaseException, timeout_s: float) -> _Failure:
    """Sort an attempt's exception into retryable (429, 408, 409, 5xx, connection, timeout, malformed body) or not."""
    import openai

    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        message = re.sub(r"^Error code: \d+ - ", "", str(exc.message))
        return _Failure(f"HTTP {status}: {message}", status in _RETRY_STATUS or status >= 500,
                        _retry_after(exc.response.headers))
    if isinstance(exc, (openai.APITimeoutError, asyncio.TimeoutError, TimeoutError)):
        return _Failure(f"timeout: no complete response within {timeout_s:g}s", True)
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc.__context__
        detail = f"{type(cause).__name__}: {cause}" if cause else str(exc)
        return _Failure(f"connection error: {detail}", True)
    timeouts, transport = _http_errors()
    if isinstance(exc, timeouts):
        return _Failure(f"timeout: no complete response within {timeout_s:g}s", True)
    if isinstance(exc, transport):  # a streamed body read line by line: the HTTP library's own errors
        return _Failure(f"connection error: {type(exc).__name__}: {exc}", True)
    if isinstance(exc, ValueError):  # a body that is not JSON (truncated by a proxy, or broken)
        return _Failure(f"malformed response: {type(exc).__name__}: {exc}", True)
    return _Failure(f"{type(exc).__name__}: {exc}", False)


def _http_errors() -> tuple[tuple[type, ...], tuple[type, ...]]:
    """(timeout, transport) exception classes of the HTTP library under the openai client (httpx2 in newer
    releases, httpx in older ones), of those imported: what reading a streamed body raises unwrapped."""
    modules = [m for m in (sys.modules.get("httpx2"), sys.modules.get("httpx")) if m is not None]
    return (tuple(m.TimeoutException for m in modules if hasattr(m, "TimeoutException")),
            tuple(m.TransportError for m in modules if hasattr(m, "TransportError")))


async def sse_data(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """The `data` of each server-sent event (several data lines joined by newlines); comments and other fields
    are skipped. An event left open when the body ends is still given: the caller decides what it is worth."""
    data: list[str] = []
    async for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
                data = []
        elif line.startswith("data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)


def _retry_after(headers: Any) -> float | None:
    """Retry-After in seconds (or OpenAI's retry-after-ms); HTTP dates are ignored."""
    try:
        if headers.get("retry-after-ms"):
            return float(headers["retry-after-ms"]) / 1000
        if headers.get("retry-after"):
            return float(headers["retry-after"])
    except (TypeError, ValueError):
        pass
    return None


def _map_strings(value: Any, fn) -> Any:
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, dict):
        return {k: _map_strings(v, fn) for k, v in value.items()}
    if isinstance(value, list):
        return [_map_strings(v, fn) for v in value]
    return value


class _LoopThread:
    """A persistent event loop on a daemon thread: `generate()` stays synchronous and connections are reused."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="toolaudit-openai", daemon=True)
        self.thread.start()

    def run(self, coro) -> Any:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


class OpenAIEngine(Engine):
    """One decode path behind an OpenAI-compatible endpoint. Validates its keys and finds its key at creation;
    `load` starts the event loop thread and the client, `close` stops them."""

    name = "openai"
    capabilities = CAPABILITIES

    def __init__(self, path: PathConfig, rng: random.Random | None = None):
        super().__init__(path)
        self.options = options_for(path)
        self._key = api_key(path, self.options)
        self._headers = header_values(path, self.options)
        sent = [f"Bearer {self._key}"] if self.options.api_key_env else []  # the Authorization header's value
        self._scrub = Scrubber(sent + list(self._headers.values()))
        self._rng = rng or random.Random()
        self._loop: _LoopThread | None = None
        self._client = None
        self._fingerprints: dict[str, None] = {}  # system_fingerprints seen, in order

    # ------------------------------------------------------------------ generation

    def generate(self, requests: list[EngineRequest]) -> list[EngineResult]:
        """One result per request, in order; at most `concurrency` in flight. Never raises for a request."""
        if not requests:
            return []
        self.load()
        results = self._loop.run(self._generate_all(requests))
        for r in results:
            if r.system_fingerprint:
                self._fingerprints.setdefault(r.system_fingerprint)
        return results

    async def _generate_all(self, requests: list[EngineRequest]) -> list[EngineResult]:
        slots = asyncio.Semaphore(self.options.concurrency)
        return list(await asyncio.gather(*(self._request(slots, r) for r in requests)))

    async def _request(self, slots: asyncio.Semaphore, req: EngineRequest) -> EngineResult:
        """Attempts with backoff between them; the last failure becomes the result's `error`."""
        opts = self.options
        failure = _Failure("not attempted", False)
        attempts = 0
        for attempt in range(opts.max_retries + 1):
            attempts += 1
            async with slots:
                try:
                    return self._scrub_result(await asyncio.wait_for(self._attempt(req), opts.timeout_s))
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 -- every failure becomes a row, never a crash
                    failure = classify(exc, opts.timeout_s)
            if not failure.retryable or attempt == opts.max_retries:
                break
            await asyncio.sleep(backoff_delay(attempt, opts.backoff_s, opts.backoff_max_s, failure.retry_after,
                                              self._rng))
        tries = f" (after {attempts} attempts)" if attempts > 1 else ""
        return EngineResult(key=req.key, error=self._scrub(failure.message)[:500] + tries)

    async def _attempt(self, req: EngineRequest) -> EngineResult:
        import openai

        kwargs = self._body(req)
        t0 = time.perf_counter()
        if not self.options.stream:
            completion = await self._client.chat.completions.create(**kwargs)
            latency = time.perf_counter() - t0
            if not hasattr(completion, "model_dump"):
                raise ValueError(f"response is not a chat completion: {str(completion)[:200]!r}")
            return result_from_response(req.key, completion.model_dump(mode="json"), latency, latency, req.logprobs)
        agg = StreamAggregate()
        async with self._client.chat.completions.with_streaming_response.create(
                **kwargs, stream=True, stream_options={"include_usage": True}) as response:
            done = False
            async for data in sse_data(response.iter_lines()):
                if done or data.startswith("[DONE]"):  # read on to the end: the connection is then reused
                    done = True
                    continue
                chunk = orjson.loads(data)  # a ValueError (malformed response) when the stream is cut mid-event
                if not isinstance(chunk, dict):
                    raise ValueError(f"stream event is not a JSON object: {data[:200]!r}")
                if chunk.get("error"):  # vLLM's way to fail mid-stream; as the openai package reports it
                    error = chunk["error"]
                    message = error.get("message") if isinstance(error, dict) else None
                    raise openai.APIError(message if isinstance(message, str) else "an error occurred during "
                                          "streaming", response.http_response.request, body=error)
                agg.add(chunk, time.perf_counter() - t0)
        if not done:
            # a stream cut between events ends "cleanly": what came may look whole (even hold the finish_reason)
            # but without [DONE] it can lack the usage chunk, later tool-call deltas or logprobs
            raise ValueError("the stream ended before [DONE]")
        if agg.finish_reason is None:
            raise ValueError("the stream ended without a finish_reason")
        latency = time.perf_counter() - t0
        ttft = agg.first_token_at if agg.first_token_at is not None else latency
        return result_from_response(req.key, agg.response(), latency, ttft, req.logprobs)

    def _body(self, req: EngineRequest) -> dict[str, Any]:
        p, opts = self.path, self.options
        body: dict[str, Any] = {"model": p.model, "messages": openai_messages(req.messages),
                                "temperature": p.temperature, "max_tokens": p.max_tokens}
        if req.tools:
            body["tools"] = openai_tools(req.tools)
            if opts.tool_choice is not None:
                body["tool_choice"] = opts.tool_choice
        if p.stop is not None:
            body["stop"] = list(p.stop)
        if p.temperature > 0:
            body["seed"] = p.seed
        if opts.logprobs or req.logprobs:
            body["logprobs"] = True
            body["top_logprobs"] = max(opts.top_logprobs if opts.logprobs else 0, req.logprobs)
        if opts.extra_body:
            body["extra_body"] = opts.extra_body
        return body

    def _scrub_result(self, result: EngineResult) -> EngineResult:
        """A server that echoes the key into its answer must not get it stored: replace it in every string."""
        if not self._scrub or not self._scrub.finds([result.text, result.message, result.tokens]):
            return result
        result.text = self._scrub(result.text)
        result.message = _map_strings(result.message, self._scrub)
        result.tokens = [self._scrub(t) for t in result.tokens]
        return result

    def _load(self) -> None:
        """The event loop thread and the client (created on that loop: its connections belong to it)."""
        self._loop = _LoopThread()
        self._client = self._loop.run(self._new_client())

    async def _new_client(self):
        import openai

        return openai.AsyncOpenAI(api_key=self._key, base_url=self.options.base_url, max_retries=0,
                                  timeout=self.options.timeout_s, default_headers=self._headers or None)

    def _release(self) -> None:
        """Close the HTTP client and stop the event loop thread (the engine can still be used afterwards)."""
        if self._client is not None:
            self._loop.run(self._client.close())
            self._client = None
        self._loop.stop()
        self._loop = None

    # ------------------------------------------------------------------ identity

    def path_components(self) -> dict[str, Any]:
        """Endpoint, model, request switches and sampling; the endpoint's system_fingerprint once known. Never the
        key (nor the name of its variable: renaming it does not change the decode path), and of `extra_headers`
        only the names (a routing header can change the path; its value is a secret)."""
        p, opts = self.path, self.options
        components: dict[str, Any] = {
            "base_url": opts.base_url,
            "model": p.model,
            "extra_body": opts.extra_body,
            "tool_choice": opts.tool_choice,
            "sampling": {"temperature": p.temperature, "max_tokens": p.max_tokens,
                         "seed": p.seed if p.temperature > 0 else None,
                         "stop": list(p.stop) if p.stop is not None else None,
                         "top_logprobs": opts.top_logprobs if opts.logprobs else None},
            "stream": opts.stream,
        }
        if opts.extra_headers:  # only when given: existing paths keep their fingerprints
            components["extra_headers"] = sorted(opts.extra_headers)
        seen = list(self._fingerprints)
        if len(seen) == 1:
            components["system_fingerprint"] = seen[0]
        elif seen:
            components["system_fingerprint"] = sorted(seen)
        return components
