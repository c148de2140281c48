"""The fields of a Langfuse generation as Chat Completions: `input` and `modelParameters` as the request,
`output` as the answer. Shared by the server export (`langfuse`) and the SDK's spans (`langfuse_otel`), which
carry the same JSON (the OpenAI integration writes both)."""

from __future__ import annotations

from typing import Any

from toolaudit.ingest.formats.base import Invalid, chat_tools, check_role

_NUMERIC_PARAMS = ("temperature", "top_p", "max_tokens", "max_completion_tokens", "frequency_penalty",
                   "presence_penalty", "seed", "n")


def request(obs: dict) -> dict:
    """The Chat request of an observation's `model`, `input` and `modelParameters`."""
    request: dict[str, Any] = {}
    if isinstance(obs.get("model"), str):
        request["model"] = obs["model"]
    value = obs.get("input")
    tools = None
    if isinstance(value, dict) and "messages" in value:
        tools = value.get("tools")
        if tools is None and value.get("functions") is not None:
            tools = [{"type": "function", "function": f} for f in value["functions"] if isinstance(f, dict)]
        if value.get("tool_choice") is not None:
            request["tool_choice"] = value["tool_choice"]
        value, where = value["messages"], "input.messages"
    else:
        where = "input"
    if value is None:
        messages: list = []
    elif isinstance(value, str):
        messages = [{"role": "user", "content": value}]
    elif isinstance(value, list):
        messages = [_message(m, f"{where}[{i}]", None) for i, m in enumerate(value)]
    else:
        raise Invalid(where, f"must be a list of messages, {{\"messages\": [...]}} or a string, got "
                             f"{type(value).__name__}")
    request["messages"] = messages
    if tools is not None:
        request["tools"] = chat_tools(tools, "input.tools")
    params = obs.get("modelParameters")
    if isinstance(params, dict):
        for key, param in params.items():
            if key in _NUMERIC_PARAMS and isinstance(param, str):
                try:
                    param = int(param) if param.strip().lstrip("-").isdigit() else float(param)
                except ValueError:
                    pass
            request.setdefault(key, param)
    return request


def _message(message: Any, where: str, default_role: str | None) -> dict:
    if not isinstance(message, dict):
        raise Invalid(where, f"must be a message object, got {type(message).__name__}")
    out = dict(message)
    out["role"] = check_role(message.get("role", default_role), f"{where}.role")
    calls = message.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise Invalid(f"{where}.tool_calls", "must be a list")
        for k, call in enumerate(calls):
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
                raise Invalid(f"{where}.tool_calls[{k}].function.name", "missing: a tool call needs the tool's name")
    return out


def finish_reason(output: Any) -> str | None:
    """The finish reason of an observation's `output` when it is a whole ChatCompletion, else None (a message
    alone does not say)."""
    if isinstance(output, dict) and isinstance(output.get("choices"), list) and output["choices"]:
        choice = output["choices"][0]
        value = choice.get("finish_reason") if isinstance(choice, dict) else None
        return value if isinstance(value, str) else None
    return None


def answer(output: Any) -> dict:
    """The assistant message of an observation's `output`."""
    if isinstance(output, str):
        return {"role": "assistant", "content": output}
    if isinstance(output, dict) and isinstance(output.get("choices"), list) and output["choices"]:
        choice = output["choices"][0]
        message = choice.get("message") if isinstance(choice, dict) else None
        return _message(message, "output.choices[0].message", "assistant")
    if isinstance(output, list) and output:
        return _message(output[-1], f"output[{len(output) - 1}]", "assistant")
    if isinstance(output, dict):
        return _message(output, "output", "assistant")
    raise Invalid("output", f"must be an assistant message, a ChatCompletion or a string, got {type(output).__name__}")
