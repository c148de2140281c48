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

Sampling (temperature > 0): each request carries `seed = request_seed(path seed, key, sample)` (the in-process
engines' `row_seed`, mod 2**31), so two calls of a path draw with different seeds and a rerun sends the same ones,
plus `top_p` and, when the path sets it, `top_k` (not in the OpenAI spec: vLLM and SGLang read it; sent in the
body beside `extra_body`). A sampled replay sends a call's samples 0..N-1 as consecutive requests of one
`generate()`; `samples_via` says how they reach the endpoint:
- "n": one request with `n = N` and the seed of sample 0; choice i is sample i (a run of samples a..b alone, as
  a resume may send, asks for n = b + 1 and keeps choices a..b). The server derives the choices' draws from
  that one seed, so they are not the draws of the "seed" way.
- "seed": N requests, each with its own sample's seed (and no `n`).
- "auto" (default): "n", until the endpoint refuses it (HTTP 400/422 naming `n`) or answers with fewer choices
  than asked; that call's samples are then sent the "seed" way, and so is every later call of this engine.
Each result records the way it came (`EngineResult.samples_via`); the fingerprint names the configured way for
paths with `samples` > 1. With n > 1 the server's usage covers all choices: each result gets the prompt tokens
and, from its logprobs, its own completion tokens (0 without logprobs).

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
import threading
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote, urlsplit

import orjson

from toolaudit import ConfigError

from ..base import Engine, EngineRequest, EngineResult
from ..completion import row_seed
from ..paths import PathConfig
from .config import CAPABILITIES, OpenAIOptions, options_for
from .failures import Failure, backoff_delay, classify, n_refused
from .metrics import ServerCounters
from .shapes import FEW_CHOICES, StreamAggregate, openai_messages, openai_tools, result_from_response
from .within import send_within

_DUMMY_KEY = "EMPTY"  # what vLLM's docs use for servers without authentication
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


def request_seed(seed: int, key: str, sample: int) -> int:
    """The seed sent for sample `sample` of call `key`: the in-process engines' `row_seed`, reduced mod 2**31 so it
    fits every server's seed type (int64 in vLLM and OpenAI's API, uint32 in llama.cpp, int32 in some gateways).
    Two calls of a path then draw with different seeds, where sending the path's seed with every request
    correlated them."""
    return row_seed(seed, key, sample) % 2**31


def sample_runs(requests: list[EngineRequest]) -> list[list[EngineRequest]]:
    """Requests split into runs of one call's consecutive samples (same key, sample indices rising by one), in
    order: how a sampled replay sends a call's N samples (0..N-1, together)."""
    runs: list[list[EngineRequest]] = []
    for req in requests:
        if runs and runs[-1][-1].key == req.key and req.sample == runs[-1][-1].sample + 1:
            runs[-1].append(req)
        else:
            runs.append([req])
    return runs


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
        self.server_counters = ServerCounters(path.name, path.model, self.options.base_url, self.options.metrics_url,
                                              {**self._headers, **({"Authorization": sent[0]} if sent else {})})
        self._n_refused: str | None = None  # samples_via "auto": why the endpoint cannot give n choices, once seen

    # ------------------------------------------------------------------ generation

    def generate(self, requests: list[EngineRequest]) -> list[EngineResult]:
        """One result per request, in order; at most `concurrency` in flight (`within_s`: within.py's way)."""
        if not requests:
            return []
        self.load()
        if self.options.within_s is not None:  # no retry loop, and no /metrics read either
            results = self._loop.run(send_within(requests, self.options.within_s, self._once, self._failure))
        else:
            before = self.server_counters.read()  # the server's spec-decode counters: acceptance (metrics.py)
            results = self._loop.run(self._generate_all(requests))
            self.server_counters.attribute(before, len(requests), results)
        for r in results:
            if r.system_fingerprint:
                self._fingerprints.setdefault(r.system_fingerprint)
        return results

    async def _once(self, req: EngineRequest) -> EngineResult:
        return self._scrub_result((await self._attempt(self._body(req), [req.key], [0]))[0])

    def _failure(self, exc: Exception) -> str:
        return self._scrub(classify(exc, self.options.timeout_s).message)[:500]

    async def _generate_all(self, requests: list[EngineRequest]) -> list[EngineResult]:
        slots = asyncio.Semaphore(self.options.concurrency)
        groups = sample_runs(requests) if self.path.sampled else [[r] for r in requests]
        answers = await asyncio.gather(*(self._group(slots, g) for g in groups))
        return [result for answer in answers for result in answer]

    async def _group(self, slots: asyncio.Semaphore, group: list[EngineRequest]) -> list[EngineResult]:
        """One call's consecutive samples: one request asking for `n` choices, or a request per sample (see the
        module docstring). A single request (greedy, or sample 0 alone) is the same either way."""
        via = self.options.samples_via
        if not self.path.sampled or via == "seed" or (via == "auto" and self._n_refused):
            return list(await asyncio.gather(*(self._single(slots, r) for r in group)))
        n = group[-1].sample + 1
        if n == 1:
            return [await self._single(slots, group[0])]
        results, failure = await self._request(slots, self._body(group[0], n), [r.key for r in group],
                                               [r.sample for r in group])
        refused = failure is not None and n_refused(failure)
        few = any((r.error or "").startswith(FEW_CHOICES) for r in results)
        if via == "auto" and (refused or few):
            # for the rest of this engine's life: an endpoint that cannot give n choices now will not later
            self._n_refused = self._n_refused or (failure.message if refused else next(
                r.error for r in results if (r.error or "").startswith(FEW_CHOICES)))
            return list(await asyncio.gather(*(self._single(slots, r) for r in group)))
        for r in results:
            r.samples_via = "n"
        return results

    async def _single(self, slots: asyncio.Semaphore, req: EngineRequest) -> EngineResult:
        result = (await self._request(slots, self._body(req), [req.key], [0]))[0][0]
        if self.path.sampled:
            result.samples_via = "seed"
        return result

    async def _request(self, slots: asyncio.Semaphore, body: dict[str, Any], keys: list[str],
                       choices: list[int]) -> tuple[list[EngineResult], Failure | None]:
        """Attempts with backoff between them: the results for `choices` of the answer (one per key), or, when
        every attempt failed, one error result per key and the last failure."""
        opts = self.options
        failure = Failure("not attempted", False)
        attempts = 0
        for attempt in range(opts.max_retries + 1):
            attempts += 1
            async with slots:
                try:
                    results = await asyncio.wait_for(self._attempt(body, keys, choices), opts.timeout_s)
                    return [self._scrub_result(r) for r in results], None
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 -- every failure becomes a row, never a crash
                    failure = classify(exc, opts.timeout_s)
            if not failure.retryable or attempt == opts.max_retries:
                break
            await asyncio.sleep(backoff_delay(attempt, opts.backoff_s, opts.backoff_max_s, failure.retry_after,
                                              self._rng))
        tries = f" (after {attempts} attempts)" if attempts > 1 else ""
        message = self._scrub(failure.message)[:500] + tries
        return [EngineResult(key=key, error=message) for key in keys], failure

    async def _attempt(self, body: dict[str, Any], keys: list[str], choices: list[int]) -> list[EngineResult]:
        import openai

        n = body.get("n", 1)
        top = body.get("top_logprobs", 0) if body.get("logprobs") else 0  # top-k pairs kept on each result
        t0 = time.perf_counter()
        if not self.options.stream:
            completion = await self._client.chat.completions.create(**body)
            latency = time.perf_counter() - t0
            if not hasattr(completion, "model_dump"):
                raise ValueError(f"response is not a chat completion: {str(completion)[:200]!r}")
            data = completion.model_dump(mode="json")
            return [result_from_response(key, data, latency, latency, index=i, n=n, top=top)
                    for key, i in zip(keys, choices)]
        aggs = {i: StreamAggregate(index=i) for i in choices}
        async with self._client.chat.completions.with_streaming_response.create(
                **body, stream=True, stream_options={"include_usage": True}) as response:
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
                now = time.perf_counter() - t0
                for agg in aggs.values():
                    agg.add(chunk, now)
        if not done:
            # a stream cut between events ends "cleanly": what came may look whole (even hold the finish_reason)
            # but without [DONE] it can lack the usage chunk, later tool-call deltas or logprobs
            raise ValueError("the stream ended before [DONE]")
        latency = time.perf_counter() - t0
        out = []
        for key, i in zip(keys, choices):
            agg = aggs[i]
            if n > 1 and not agg.seen:
                out.append(EngineResult(key=key, error=f"{FEW_CHOICES}: no choice {i} in the stream (n = {n})"))
                continue
            if agg.finish_reason is None:
                raise ValueError("the stream ended without a finish_reason")
            ttft = agg.first_token_at if agg.first_token_at is not None else latency
            out.append(result_from_response(key, agg.response(), latency, ttft, index=i, n=n, top=top))
        return out

    def _body(self, req: EngineRequest, n: int = 1) -> dict[str, Any]:
        """The request for `req` (with `n` > 1: for samples 0..n-1 of its call, seeded as sample 0)."""
        p, opts = self.path, self.options
        body: dict[str, Any] = {"model": p.model, "messages": openai_messages(req.messages),
                                "temperature": p.temperature, "max_tokens": p.max_tokens}
        if req.tools:
            body["tools"] = openai_tools(req.tools)
            if opts.tool_choice is not None:
                body["tool_choice"] = opts.tool_choice
        if p.stop is not None:
            body["stop"] = list(p.stop)
        if p.sampled:
            body["seed"] = request_seed(p.seed, req.key, 0 if n > 1 else req.sample)
            body["top_p"] = p.top_p
            if n > 1:
                body["n"] = n
        if opts.logprobs or req.logprobs:  # the path's option, or a probe's request (`EngineRequest.logprobs`)
            body["logprobs"] = True
            body["top_logprobs"] = max(opts.top_logprobs if opts.logprobs else 0, req.logprobs)
        extra = dict(opts.extra_body)
        if p.sampled and p.top_k:
            extra["top_k"] = p.top_k  # not in the OpenAI spec; vLLM and SGLang read it from the body
        if extra:
            body["extra_body"] = extra
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
                         "top_logprobs": opts.top_logprobs if opts.logprobs else None,
                         **p.sampling_components(),
                         # only where a call has several samples: how they are asked for changes their draws
                         **({"samples_via": opts.samples_via} if p.sampled and p.samples > 1 else {})},
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
