"""The OpenAI Chat Completions shapes the generated logs record, built one way for both generators.

A log line is `{"request": ..., "response": ...}`; session, customer and call index ride in
`request.metadata` (strings, as the OpenAI API requires), which is where toolaudit reads them by default.
"""

from __future__ import annotations

import random
import string

from .files import dumps


def rand_id(rng: random.Random, n: int) -> str:
    alphabet = string.ascii_letters + string.digits
    return "".join(rng.choice(alphabet) for _ in range(n))


def fingerprint(rng: random.Random) -> str:
    """A `system_fingerprint` like OpenAI's: `fp_` and ten hex digits."""
    return "fp_" + "".join(rng.choice("0123456789abcdef") for _ in range(10))


def function_tool(name: str, description: str, parameters: dict) -> dict:
    """A tool as a request offers it."""
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def tool_call(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def request(model: str, messages: list[dict], tools: list[dict], session_id: str, customer: str, index: int):
    """What an agent sends: greedy, tools offered with `tool_choice` auto, the session in metadata."""
    return {
        "model": model,
        "messages": messages,
        "tools": tools,
        "tool_choice": "auto",
        "temperature": 0,
        "metadata": {"session_id": session_id, "customer": customer, "call_index": str(index)},
    }


def prompt_tokens(req: dict) -> int:
    """A rough token count (4 characters a token) for the recorded usage; nothing reads it as exact."""
    return len(dumps(req["messages"]) + dumps(req["tools"])) // 4


def usage(prompt: int, message: dict) -> dict:
    """Usage for a response message: ~3 characters a token of arguments plus 8 per call, 4 per content token."""
    completion = sum(len(tc["function"]["arguments"]) // 3 + 8 for tc in message.get("tool_calls", []))
    completion += len(message.get("content") or "") // 4
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def response(
    resp_id: str,
    created: int,
    model: str,
    system_fingerprint: str,
    prompt: int,
    tool_calls: list[dict] | None,
    content: str | None = None,
    finish_reason: str = "tool_calls",
) -> dict:
    message = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": resp_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": system_fingerprint,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": usage(prompt, message),
    }


def finished_turn(user: str, calls: list[tuple[dict, str]], summary: str) -> list[dict]:
    """A turn as the next request's context holds it: the user, each (tool call, its result), a summary."""
    msgs = [{"role": "user", "content": user}]
    for call, result in calls:
        msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        msgs.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    msgs.append({"role": "assistant", "content": summary})
    return msgs
