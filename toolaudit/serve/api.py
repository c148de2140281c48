"""The OpenAI Chat Completions shapes `toolaudit serve` speaks: request validation, responses, stream chunks and
errors. Pure functions over dicts and `EngineResult`s, so they are testable without a server or a model.

Logprobs: in-process engines keep, for each generated token, the top-2 token ids and the top-1 minus top-2
*logit* margin, not the log-softmax normaliser. Since log-softmax subtracts the same constant from every logit,
that margin is exactly logprob(top-1) - logprob(top-2). The values returned are therefore logprobs relative to
the top-1 token: top-1 gets 0.0 and top-2 gets -margin (true logprobs are these minus log(sum(exp(logit - max))),
which is >= 0, so they are upper bounds). A client computing top-1 minus top-2 gets the engine's margin exactly.
At most two alternatives exist (`top_logprobs` above 2 returns two). A sampled token outside the top two gets
-9999.0, OpenAI's marker for "very unlikely"; with greedy decoding that never happens.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from toolaudit.engines.base import EngineResult
from toolaudit.validate.toolcalls import parse_text

UNKNOWN_LOGPROB = -9999.0
STREAM_PIECE = 16  # characters of content / arguments per stream chunk (exercises clients' delta joining)


class ApiError(Exception):
    """An OpenAI-style error response: `{"error": {"message", "type", "param", "code"}}` with an HTTP status."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class ChatRequest:
    """A validated chat completion request. `None` settings fall back to the served path's own."""

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    max_tokens: int | None = None
    temperature: float | None = None
    stop: tuple[str, ...] | None = None
    seed: int | None = None
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    tokens_as_ids: bool = False  # vLLM's `return_tokens_as_token_ids`: tokens as "token_id:N"


def _bad(message: str, param: str | None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def _int(body: dict, key: str, low: int, high: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise _bad(f"'{key}' must be an integer {bound} (got {value!r})", key)
    return value


def _bool(body: dict, key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _bad(f"'{key}' must be a boolean (got {value!r})", key)
    return value


def parse_chat_request(body: Any, served: Sequence[str]) -> ChatRequest:
    """Validate a request body; raises `ApiError` (400, or 404 for an unknown model) naming the parameter."""
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", None)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' is required (a string)", "model")
    if model not in served:
        raise ApiError(404, f"The model '{model}' does not exist (served: {', '.join(served)})",
                       param="model", code="model_not_found")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("'messages' must be a non-empty array of messages", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise _bad(f"messages[{i}] must be an object with a string 'role'", f"messages[{i}]")
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise _bad("'tools' must be an array of tools", "tools")
    for i, t in enumerate(tools):
        fn = t.get("function", t) if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise _bad(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}",
                       f"tools[{i}]")
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "required"):
        raise _bad(f"tool_choice {choice!r} is not supported: the served engine answers as its path's prompt "
                   f"makes it (use \"auto\")", "tool_choice", "unsupported_value")
    if body.get("n") not in (None, 1):
        raise _bad("only n = 1 is supported", "n", "unsupported_value")
    if body.get("top_p") not in (None, 1, 1.0):
        raise _bad("top_p is not supported by the served engine (only 1)", "top_p", "unsupported_value")
    temperature = body.get("temperature")
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
                                    or not 0 <= temperature <= 2):
        raise _bad(f"'temperature' must be a number between 0 and 2 (got {temperature!r})", "temperature")
    max_tokens = _int(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens", 1)
    stop = body.get("stop")
    if stop is not None:
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 4:
            raise _bad("'stop' must be a string or an array of up to 4 non-empty strings", "stop")
        stop = tuple(stop)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise _bad(f"'seed' must be an integer (got {seed!r})", "seed")
    stream = _bool(body, "stream")
    options = body.get("stream_options")
    if options is not None and (not stream or not isinstance(options, dict)):
        raise _bad("'stream_options' is only allowed with stream = true, as an object", "stream_options")
    logprobs = _bool(body, "logprobs")
    top = _int(body, "top_logprobs", 0, 20)
    if top is not None and not logprobs:
        raise _bad("'top_logprobs' needs 'logprobs' = true", "top_logprobs")
    return ChatRequest(
        model=model, messages=messages, tools=tools, max_tokens=max_tokens,
        temperature=None if temperature is None else float(temperature), stop=stop, seed=seed, stream=stream,
        include_usage=bool((options or {}).get("include_usage")), logprobs=logprobs, top_logprobs=top or 0,
        tokens_as_ids=_bool(body, "return_tokens_as_token_ids"),
    )


def _arguments_json(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # integers beyond 64 bits and the like: the stdlib encoder copes
        import json

        return json.dumps(value, ensure_ascii=False)


def assistant_message(result: EngineResult, completion_id: str) -> tuple[dict[str, Any], str]:
    """The engine's text as an OpenAI assistant message and finish reason: parsed tool calls go to
    `tool_calls` (finish_reason "tool_calls"), the text around them to `content`. Text that does not parse as a
    tool call is returned whole as `content`, as a tool-call parser on a serving engine does."""
    parsed = parse_text(result.text)
    finish = result.finish_reason or "stop"
    if parsed.status != "ok":
        return {"role": "assistant", "content": result.text, "tool_calls": []}, finish
    calls = []
    for i, call in enumerate(parsed.calls):
        raw = call.raw_arguments if call.raw_arguments is not None else _arguments_json(call.arguments)
        calls.append({"id": f"call_{completion_id[-16:]}{i}", "type": "function",
                      "function": {"name": call.name, "arguments": raw}})
    return {"role": "assistant", "content": parsed.text or None, "tool_calls": calls}, "tool_calls"


def logprobs_content(result: EngineResult, piece: Callable[[int], str], top_n: int,
                     as_ids: bool) -> list[dict[str, Any]]:
    """One OpenAI logprob entry per generated token, from the engine's top-2 ids and margins (see module doc)."""
    def name(token: int) -> str:
        return f"token_id:{token}" if as_ids else piece(token)

    entries = []
    for token, (first, second), margin in zip(result.token_ids, result.top2, result.margins):
        values = {first: 0.0, second: -float(margin)}
        alternatives = [{"token": name(t), "logprob": values[t], "bytes": list(piece(t).encode())}
                        for t in (first, second)][: min(top_n, 2)]
        entries.append({"token": name(token), "logprob": values.get(token, UNKNOWN_LOGPROB),
                        "bytes": list(piece(token).encode()), "top_logprobs": alternatives})
    return entries


def usage(result: EngineResult) -> dict[str, int]:
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
            "total_tokens": result.prompt_tokens + result.completion_tokens}


def new_completion_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex


def completion_body(cid: str, created: int, model: str, fingerprint: str, message: dict[str, Any], finish: str,
                    logprobs: list[dict[str, Any]] | None, result: EngineResult) -> dict[str, Any]:
    if not message["tool_calls"]:
        message = {k: v for k, v in message.items() if k != "tool_calls"}
    return {"id": cid, "object": "chat.completion", "created": created, "model": model,
            "system_fingerprint": fingerprint,
            "choices": [{"index": 0, "message": message, "finish_reason": finish,
                         "logprobs": None if logprobs is None else {"content": logprobs}}],
            "usage": usage(result)}


def stream_chunks(cid: str, created: int, model: str, fingerprint: str, message: dict[str, Any], finish: str,
                  logprobs: list[dict[str, Any]] | None, result: EngineResult,
                  include_usage: bool) -> Iterator[dict[str, Any]]:
    """The same completion as `chat.completion.chunk`s: role, content pieces, each tool call (name first, then
    argument pieces), logprobs, the finish reason, and usage when asked for."""
    def chunk(delta: dict[str, Any], finish_reason: str | None = None, lp: list | None = None) -> dict[str, Any]:
        return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                "system_fingerprint": fingerprint,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason,
                             "logprobs": None if lp is None else {"content": lp}}]}

    yield chunk({"role": "assistant", "content": ""})
    content = message.get("content") or ""
    for start in range(0, len(content), STREAM_PIECE):
        yield chunk({"content": content[start: start + STREAM_PIECE]})
    for i, call in enumerate(message["tool_calls"]):
        fn = call["function"]
        yield chunk({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                     "function": {"name": fn["name"], "arguments": ""}}]})
        args = fn["arguments"]
        for start in range(0, len(args), STREAM_PIECE):
            yield chunk({"tool_calls": [{"index": i, "function": {"arguments": args[start: start + STREAM_PIECE]}}]})
    if logprobs:
        yield chunk({}, lp=logprobs)
    yield chunk({}, finish_reason=finish)
    if include_usage:
        yield {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
               "system_fingerprint": fingerprint, "choices": [], "usage": usage(result)}
