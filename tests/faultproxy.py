"""A fault-injecting reverse proxy for Chat Completions: loopback only, in front of a real upstream server
(`toolaudit serve`, vLLM), so the openai engine meets the faults a gateway or an overloaded server produces,
with the real openai client on one side and real answers on the other.

Which request gets which fault is fixed before the run by a seeded `FaultSchedule` over the requests' identities
(the recorded messages and whether the response is streamed), and the attempt number of that request: not by
arrival order, which concurrency shuffles. A fault is transient (first attempt only: the retry must recover) or
persistent (every attempt: the call must end as an error row). Every wait is bounded: a stall ends when the
client gives up or at twice the client's timeout, whichever comes first; a drip ends well inside it.
The proxy counts what it injected, per kind, and every attempt it saw.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import socket
import struct
import time
from collections import Counter
from dataclasses import dataclass, field

from aiohttp import ClientSession, ClientTimeout, web

# kinds that answer without asking the upstream
STATUS_KINDS = {"429_retry_after": 429, "429": 429, "500": 500, "502": 502, "503": 503}
# every kind, in the order tables print them
KINDS = (*STATUS_KINDS, "reset_before_body", "reset_mid_body", "stall", "truncated_honest", "truncated_short",
         "html_200", "slow_drip", "slow_loris", "stream_cut", "stream_cut_after_finish")
PLAIN_ONLY = frozenset({"truncated_honest", "truncated_short"})  # a streamed body's truncation is a stream cut
STREAM_ONLY = frozenset({"stream_cut", "stream_cut_after_finish"})
SUCCEEDS = frozenset({"slow_drip"})  # a fault the client must ride out on the same attempt
RETRY_AFTER_S = 0.1


def request_key(messages: list, stream: bool) -> str:
    """A request's identity: its messages and whether it streams (the two sides of a replay differ in that)."""
    blob = json.dumps({"messages": messages, "stream": bool(stream)}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def call_keys(calls) -> dict[tuple[str, int], tuple[str, str]]:
    """(plain key, streamed key) per replayed call, by (session, call index): the requests' identities the
    openai engine's messages give (`openai_messages` turns recorded tool-call arguments into strings)."""
    from toolaudit.engines.openai.shapes import openai_messages

    return {(c.session_id, c.call_index): (request_key(openai_messages(c.request["messages"]), False),
                                           request_key(openai_messages(c.request["messages"]), True))
            for c in calls}


@dataclass(frozen=True)
class Fault:
    kind: str
    persistent: bool  # on every attempt (the call ends as an error row); else on the first attempt only
    at: float = 0.5  # where a cut falls: the fraction of the body (or of the stream's events) sent first


@dataclass
class FaultSchedule:
    """Faults by request identity. `seeded` spreads every applicable kind over the given requests, each kind
    once transient and once persistent where there are enough requests; requests left over get none."""

    plan: dict[str, Fault] = field(default_factory=dict)

    def ends_in_error(self, key: str) -> bool:
        """Whether the request fails on every attempt (so its call must end as an error row)."""
        f = self.plan.get(key)
        return f is not None and f.persistent and f.kind not in SUCCEEDS

    def attempts(self, key: str, max_retries: int) -> int:
        """How many attempts the client must make for the request: every one allowed for a persistent fault,
        two for a transient one, one for a fault the client rides out or none."""
        f = self.plan.get(key)
        if f is None or f.kind in SUCCEEDS:
            return 1
        return max_retries + 1 if f.persistent else 2

    def fault(self, key: str, attempt: int) -> Fault | None:
        f = self.plan.get(key)
        if f is None or (attempt > 1 and not f.persistent):
            return None
        return f

    @classmethod
    def seeded(cls, seed: int, calls: list[tuple[str, str]], kinds: tuple[str, ...] = KINDS) -> FaultSchedule:
        """`calls`: (plain key, streamed key) per call. A kind both sides can meet is transient on one side
        and persistent on the other; a kind only one side can meet is both there. A call's two requests are
        both transient or both persistent, so the run holds calls that must recover and calls that must end as
        error rows (at most 16 of each for all kinds; the calls beyond get no fault)."""
        rng = random.Random(seed)
        order = list(range(len(calls)))
        rng.shuffle(order)
        shared = [k for k in kinds if k not in PLAIN_ONLY | STREAM_ONLY]
        rng.shuffle(shared)
        half = len(shared) // 2
        plan: dict[str, Fault] = {}
        for side, own in ((0, PLAIN_ONLY), (1, STREAM_ONLY)):
            slots = [(k, (i < half) != bool(side)) for i, k in enumerate(shared)]
            slots += [(k, p) for k in kinds if k in own for p in (False, True)]
            rng.shuffle(slots)
            slots.sort(key=lambda s: s[1])  # transient first: pairs up with the other side's
            for call, (kind, persistent) in zip(order, slots):
                plan[calls[call][side]] = Fault(kind, persistent or kind in SUCCEEDS, rng.uniform(0.2, 0.8))
        return cls(plan)


@dataclass
class Attempt:
    """One request the proxy saw: which attempt of which request, what it did to it, and when."""

    key: str
    attempt: int
    fault: str | None
    at: float  # time.monotonic() when it arrived
    answered: float = 0.0  # when the proxy finished with it (answer sent, or connection cut)


class FaultProxy:
    """An aiohttp application forwarding `POST /v1/chat/completions` (and anything else, as is) to `upstream`
    (".../v1"), injecting the schedule's faults. `schedule = None` forwards everything untouched."""

    def __init__(self, upstream: str, timeout_s: float, schedule: FaultSchedule | None = None):
        self.upstream = upstream.rstrip("/")
        self.timeout_s = timeout_s
        self.schedule = schedule
        self.attempts: list[Attempt] = []
        self.seen: Counter = Counter()  # key -> attempts
        self._session: ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=32 << 20)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.on_cleanup.append(self._close)
        return app

    @property
    def injected(self) -> Counter:
        return Counter(a.fault for a in self.attempts if a.fault)

    def reset_counts(self) -> None:
        self.attempts.clear()
        self.seen.clear()

    async def _close(self, _app) -> None:
        if self._session is not None:
            await self._session.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        fault = None
        record = None
        if request.method == "POST" and request.path.endswith("/chat/completions"):
            data = json.loads(body)
            key = request_key(data["messages"], bool(data.get("stream")))
            self.seen[key] += 1
            fault = self.schedule.fault(key, self.seen[key]) if self.schedule else None
            record = Attempt(key, self.seen[key], fault.kind if fault else None, time.monotonic())
            self.attempts.append(record)
        try:
            return await self._respond(request, body, fault)
        finally:
            if record is not None:
                record.answered = time.monotonic()

    async def _respond(self, request: web.Request, body: bytes, fault: Fault | None) -> web.StreamResponse:
        kind = fault.kind if fault else None
        if kind in STATUS_KINDS:
            headers = {"Retry-After": f"{RETRY_AFTER_S:g}"} if kind == "429_retry_after" else {}
            return web.json_response({"error": {"message": f"injected {kind}", "type": "fault", "param": None,
                                                "code": None}}, status=STATUS_KINDS[kind], headers=headers)
        if kind == "reset_before_body":
            return _reset(request, web.Response())
        if kind == "html_200":
            return web.Response(text="<html><body><h1>502 Bad Gateway</h1><p>nginx</p></body></html>",
                                content_type="text/html")
        status, content_type, answer = await self._forward(request, body)
        if kind is None or status != 200:
            return web.Response(body=answer, status=status, headers={"Content-Type": content_type})
        if kind == "stall":  # hold the answer until the client gives up, or twice its timeout at most
            deadline = time.monotonic() + 2 * self.timeout_s
            while time.monotonic() < deadline and not _gone(request):
                await asyncio.sleep(0.01)
            return _reset(request, web.Response())
        streamed = content_type.startswith("text/event-stream")
        if kind in ("slow_drip", "slow_loris"):
            # drip: 8 pieces over a quarter of the timeout, must succeed; loris: each piece well inside the
            # client's read timeout, the whole past its deadline (then cut), must time out
            total = self.timeout_s * (0.25 if kind == "slow_drip" else 2.0)
            pieces = 8
            response = await _start(request, content_type, None if streamed else len(answer))
            step = -(-len(answer) // pieces)
            for i in range(0, len(answer), step):
                if _gone(request):
                    return response
                await response.write(answer[i: i + step])
                await asyncio.sleep(total / pieces)
            await response.write_eof()
            return response
        if kind.startswith("stream_cut"):  # the first events of the stream, never [DONE], then a clean end
            events = [e for e in answer.split(b"\n\n") if e.strip()]
            if kind == "stream_cut":  # somewhere before the chunk with the finish_reason
                keep = max(1, min(_finish_event(events), round(fault.at * len(events))))
            else:  # the finish_reason sent, the usage chunk and [DONE] not
                keep = _finish_event(events) + 1
            response = await _start(request, content_type, None)
            await response.write(b"".join(e + b"\n\n" for e in events[:keep]))
            await response.write_eof()
            return response
        cut = answer[: max(1, int(len(answer) * fault.at))]
        if kind == "truncated_honest":  # a complete response whose body is not all of the JSON
            return web.Response(body=cut, headers={"Content-Type": content_type})
        response = await _start(request, content_type, None if streamed else len(answer))
        await response.write(cut)
        if kind == "truncated_short":  # Content-Length promises more; the connection closes cleanly (FIN)
            request.transport.close()
            return response
        if kind == "reset_mid_body":
            return _reset(request, response)
        raise AssertionError(f"unknown fault kind {kind!r}")

    async def _forward(self, request: web.Request, body: bytes) -> tuple[int, str, bytes]:
        if self._session is None:
            self._session = ClientSession(timeout=ClientTimeout(total=60))
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() in ("content-type", "authorization", "x-request-id", "accept")}
        url = self.upstream + request.path.removeprefix("/v1")
        async with self._session.request(request.method, url, data=body or None, headers=headers) as up:
            return up.status, up.headers.get("Content-Type", "application/json"), await up.read()


async def _start(request: web.Request, content_type: str, length: int | None) -> web.StreamResponse:
    headers = {"Content-Type": content_type}
    if length is not None:
        headers["Content-Length"] = str(length)
    response = web.StreamResponse(headers=headers)
    if length is None:
        response.enable_chunked_encoding()
    await response.prepare(request)
    return response


def _finish_event(events: list[bytes]) -> int:
    """The index of the SSE event whose chunk carries a finish_reason."""
    for i, event in enumerate(events):
        data = event.removeprefix(b"data: ")
        if data != b"[DONE]" and any(c.get("finish_reason") for c in json.loads(data).get("choices") or ()):
            return i
    raise AssertionError("the upstream's stream has no finish_reason")


def _gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


def _reset(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
    """Abort the connection with a TCP RST (SO_LINGER 0), as a crashed server or a dropped NAT entry does."""
    transport = request.transport
    if transport is not None:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
    return response
