"""Chat Completions shapes the openai engine reads and writes: request tools and messages, streamed chunks
folded back into one response, logprobs turned into decode evidence, and a response body turned into an
`EngineResult`. Pure functions over dicts: testable without a server.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from ..base import EngineResult

_TOKEN_ID = re.compile(r"token_id:(\d+)")  # vLLM's `return_tokens_as_token_ids` token strings


def openai_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Trace tools as the Chat Completions API wants them: bare function objects are wrapped."""
    return [t if isinstance(t, dict) and "function" in t else {"type": "function", "function": t} for t in tools]


def openai_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Recorded messages, with assistant tool-call arguments as JSON strings (some logs store objects)."""
    out = []
    for m in messages:
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        if calls and any(isinstance(c, dict) and not isinstance((c.get("function") or {}).get("arguments"), str)
                         for c in calls):
            m = dict(m)
            m["tool_calls"] = [
                c if not isinstance(c, dict) or isinstance((c.get("function") or {}).get("arguments"), str)
                else {**c, "function": {**c["function"],
                                        "arguments": orjson.dumps(c["function"].get("arguments", {})).decode()}}
                for c in calls
            ]
        out.append(m)
    return out


FEW_CHOICES = "fewer choices than asked for"  # how a result missing from an answer with n choices starts


class StreamAggregate:
    """Chat-completion chunks folded back into one response: content, tool calls (argument deltas appended by
    index), logprobs, finish reason, usage and fingerprint, of the choice `index` (a request with n > 1 streams
    every choice's deltas interleaved, each chunk naming its choice)."""

    def __init__(self, index: int = 0) -> None:
        self.index = index
        self.seen = False  # whether any chunk named this choice
        self.content: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.logprobs: list[dict[str, Any]] = []
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.system_fingerprint: str | None = None
        self.first_token_at: float | None = None

    def add(self, chunk: dict[str, Any], now: float) -> None:
        self.system_fingerprint = chunk.get("system_fingerprint") or self.system_fingerprint
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != self.index:
                continue
            self.seen = True
            delta = choice.get("delta") or {}
            got = False
            if delta.get("content"):
                self.content.append(delta["content"])
                got = True
            for tc in delta.get("tool_calls") or ():
                slot = self.tool_calls.setdefault(tc.get("index", 0), {
                    "id": None, "type": "function", "function": {"name": "", "arguments": ""}})
                slot["id"] = tc.get("id") or slot["id"]
                fn = tc.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
                got = True
            entries = (choice.get("logprobs") or {}).get("content") or ()
            self.logprobs.extend(entries)
            if (got or entries) and self.first_token_at is None:
                self.first_token_at = now
            self.finish_reason = choice.get("finish_reason") or self.finish_reason

    def response(self) -> dict[str, Any]:
        """The equivalent non-streamed response body (the fields this engine reads)."""
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        return {"choices": [{"index": self.index, "message": message, "finish_reason": self.finish_reason,
                             "logprobs": {"content": self.logprobs} if self.logprobs else None}],
                "usage": self.usage, "system_fingerprint": self.system_fingerprint}


def logprob_evidence(entries: list[dict[str, Any]]) -> tuple[list[str], list[float], list[int], list[tuple]]:
    """(tokens, margins, token ids, top-2 ids) from Chat Completions logprobs. Margins need two alternatives at
    every position (else none are given, so positions never shift). When the server returns tokens as
    `token_id:N` (vLLM's `return_tokens_as_token_ids`) they become ids and the token strings are left empty, so
    a divergence is never computed between ids on one path and token texts on the other."""
    tokens = [str(e.get("token", "")) for e in entries]
    tops = [sorted((t for t in e.get("top_logprobs") or () if t.get("logprob") is not None),
                   key=lambda t: -t["logprob"]) for e in entries]
    margins = [float(t[0]["logprob"] - t[1]["logprob"]) for t in tops] if all(len(t) >= 2 for t in tops) else []
    ids = [_TOKEN_ID.fullmatch(t) for t in tokens]
    token_ids = [int(m.group(1)) for m in ids] if ids and all(ids) else []
    top2: list[tuple] = []
    if token_ids and margins:
        pairs = [tuple(_TOKEN_ID.fullmatch(str(x.get("token", ""))) for x in t[:2]) for t in tops]
        if all(a and b for a, b in pairs):
            top2 = [(int(a.group(1)), int(b.group(1))) for a, b in pairs]
    return ([] if token_ids else tokens), margins, token_ids, top2


def top_logprob_pairs(entries: list[dict[str, Any]], k: int) -> list[list[tuple[int | str, float]]]:
    """Per token, its top-k alternatives as (token, logprob), most likely first, the values as the server sent
    them; tokens as ids when the server writes `token_id:N`. Empty when k is 0 or any token lacks alternatives
    (a server with logprobs disabled, e.g. during speculation, sends none)."""
    if k <= 0 or not entries or not all(e.get("top_logprobs") for e in entries):
        return []
    steps = []
    for e in entries:
        ranked = sorted((t for t in e["top_logprobs"] if t.get("logprob") is not None), key=lambda t: -t["logprob"])
        steps.append([(_token(str(t.get("token", ""))), float(t["logprob"])) for t in ranked[:k]])
    return steps


def _token(text: str) -> int | str:
    match = _TOKEN_ID.fullmatch(text)
    return int(match.group(1)) if match else text


def result_from_response(key: str, data: dict[str, Any], latency_s: float, ttft_s: float, index: int = 0,
                         n: int = 1, top: int = 0) -> EngineResult:
    """Choice `index` of a Chat Completions response body (or an aggregated stream) -> EngineResult (`top`: the
    top-k logprobs the request asked for, `EngineRequest.logprobs`).

    With n > 1 choices, usage is the request's: the prompt is counted once (as every choice's `prompt_tokens`) and
    completion tokens are summed over the choices, so a choice's own count comes from its logprobs (0 without
    them). A choice the answer lacks is an error starting with `FEW_CHOICES`."""
    choices = data.get("choices") or []
    choice = next((c for c in choices if isinstance(c, dict) and c.get("index", 0) == index), None)
    if choice is None and n == 1 and choices and isinstance(choices[0], dict):
        choice = choices[0]  # a server that numbers its only choice oddly
    if choice is None and n > 1:
        return EngineResult(key=key, error=f"{FEW_CHOICES}: no choice {index} among the {len(choices)} returned "
                                           f"(n = {n})", system_fingerprint=data.get("system_fingerprint"))
    if choice is None or not isinstance(choice.get("message"), dict):
        return EngineResult(key=key, error=f"malformed response: no choices[{index}].message",
                            system_fingerprint=data.get("system_fingerprint"))
    message = {k: v for k, v in choice["message"].items() if v is not None or k == "content"}
    entries = (choice.get("logprobs") or {}).get("content") or []
    tokens, margins, token_ids, top2 = logprob_evidence(entries)
    usage = data.get("usage") or {}
    completion = usage.get("completion_tokens") if n == 1 else None
    return EngineResult(
        key=key, text=message.get("content") or "", token_ids=token_ids,
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(completion or len(tokens) or len(token_ids)),
        latency_s=latency_s, ttft_s=ttft_s, margins=margins, top2=top2, tokens=tokens, message=message,
        system_fingerprint=data.get("system_fingerprint"), finish_reason=choice.get("finish_reason"),
        top_logprobs=top_logprob_pairs(entries, top),
    )
