"""What the openai engine makes of a failed attempt: the message to record, whether to retry and after how long
(`classify`, `backoff_delay`), and whether a request asking for n choices was refused for asking (`n_refused`)."""

from __future__ import annotations

import asyncio
import random
import re
import sys
from dataclasses import dataclass
from typing import Any

_RETRY_STATUS = frozenset({408, 409, 429})
_N_PARAM = re.compile(r"(?<![\w.-])n(?![\w.-])")  # the parameter n named in an error message ('n', n = 1, ...)


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
class Failure:
    """One failed attempt: what to record, whether to try again, and how long the server asked us to wait; an
    HTTP error's status and the parameter its body names, when it names one."""

    message: str
    retryable: bool
    retry_after: float | None = None
    status: int | None = None
    param: str | None = None


def n_refused(failure: Failure) -> bool:
    """Whether a failed request with `n` > 1 was refused for asking for n choices: a 400 (or 422) whose error names
    the parameter `n` (OpenAI's `param`, or the word n in the message, e.g. "only n = 1 is supported")."""
    if failure.status not in (400, 422):
        return False
    return failure.param == "n" or _N_PARAM.search(failure.message) is not None


def classify(exc: BaseException, timeout_s: float) -> Failure:
    """Sort an attempt's exception into retryable (429, 408, 409, 5xx, connection, timeout, malformed body) or not."""
    import openai

    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        message = re.sub(r"^Error code: \d+ - ", "", str(exc.message))
        body = exc.body.get("error", exc.body) if isinstance(exc.body, dict) else None
        param = body.get("param") if isinstance(body, dict) else None
        return Failure(f"HTTP {status}: {message}", status in _RETRY_STATUS or status >= 500,
                        _retry_after(exc.response.headers), status, param if isinstance(param, str) else None)
    if isinstance(exc, (openai.APITimeoutError, asyncio.TimeoutError, TimeoutError)):
        return Failure(f"timeout: no complete response within {timeout_s:g}s", True)
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc.__context__
        detail = f"{type(cause).__name__}: {cause}" if cause else str(exc)
        return Failure(f"connection error: {detail}", True)
    timeouts, transport = _http_errors()
    if isinstance(exc, timeouts):
        return Failure(f"timeout: no complete response within {timeout_s:g}s", True)
    if isinstance(exc, transport):  # a streamed body read line by line: the HTTP library's own errors
        return Failure(f"connection error: {type(exc).__name__}: {exc}", True)
    if isinstance(exc, ValueError):  # a body that is not JSON (truncated by a proxy, or broken)
        return Failure(f"malformed response: {type(exc).__name__}: {exc}", True)
    return Failure(f"{type(exc).__name__}: {exc}", False)


def _http_errors() -> tuple[tuple[type, ...], tuple[type, ...]]:
    """(timeout, transport) exception classes of the HTTP library under the openai client (httpx2 in newer
    releases, httpx in older ones), of those imported: what reading a streamed body raises unwrapped."""
    modules = [m for m in (sys.modules.get("httpx2"), sys.modules.get("httpx")) if m is not None]
    return (tuple(m.TimeoutException for m in modules if hasattr(m, "TimeoutException")),
            tuple(m.TransportError for m in modules if hasattr(m, "TransportError")))


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
