"""A `generate()` call within a deadline: the openai engine's `within_s` key, which a replay's probe sets on the
paths it probes (`replay.probe`, `replay.probes`) and which `Capabilities.overrides` declares, so the probe asks
for it through the engine contract. Not the replay's retry loop (`OpenAIEngine._request`): the requests go one
at a time, one attempt each (no retry, no backoff), all within `within_s` seconds in total (a request's timeout
is what is left of it), and after the first failure (an HTTP error, a reset, a malformed or cut body, the
deadline) nothing more is sent: each request left is an error result saying so. Never raises for a request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from ..base import EngineRequest, EngineResult


async def send_within(requests: list[EngineRequest], seconds: float,
                      attempt: Callable[[EngineRequest], Awaitable[EngineResult]],
                      failure: Callable[[Exception], str]) -> list[EngineResult]:
    """One result per request, in order: `attempt(request)` once each while the deadline lasts; `failure(exc)`
    is the recorded message of an attempt that raised."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    out: list[EngineResult] = []
    failed: str | None = None
    for req in requests:
        if failed is not None:
            out.append(EngineResult(key=req.key, error=f"not sent: an earlier request failed ({failed})"))
            continue
        try:
            left = end - loop.time()
            if left <= 0:
                raise TimeoutError
            out.append(await asyncio.wait_for(attempt(req), left))
            continue
        except asyncio.CancelledError:
            raise
        except (asyncio.TimeoutError, TimeoutError):
            failed = f"timeout: no complete answer within the deadline of {seconds:.1f} s for all requests"
        except Exception as exc:  # noqa: BLE001 -- every failure becomes a result, never a crash
            failed = failure(exc)
        out.append(EngineResult(key=req.key, error=failed))
    return out
