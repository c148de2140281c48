"""OpenAI Responses API logs: one `{"request": <responses.create body>, "response": <Response>}` per line.

The request's `instructions` become a system message; `input` (a string, or a list of items) becomes the
conversation: messages (`{role, content}` with `input_text` / `output_text` parts), `function_call` items
(the assistant's earlier calls) and `function_call_output` items (their results, as tool messages). Function
tools become Chat tools; built-in tools (web search, file search...) are left out, as they are not called
with JSON arguments. The answer is the response's `output`: `message` items give the text, `function_call`
items the tool calls (arguments kept byte for byte). Session, customer and call index are read as in OpenAI
logs (`--session-key request.metadata.session_id` by default); `response.metadata` is tried when the request
has no `metadata`. Reasoning items are not compared.
"""

from __future__ import annotations

from typing import Any

from toolaudit.ingest.formats.base import (
    DEFAULT_CUSTOMER_KEY,
    DEFAULT_SESSION_KEY,
    Call,
    Conversion,
    Invalid,
    Keys,
    Origin,
    arguments_text,
    as_key,
    chat_response,
    chat_tools,
    check_role,
    get_dotted,
    load_line,
    record_lines,
    text_content,
    usage_block,
)
from toolaudit.ingest.formats.contract import Sample, TraceFormat
from toolaudit.ingest.registry import mixed

_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
_COPIED = ("model", "temperature", "top_p", "parallel_tool_calls", "user", "seed", "store")


def read(path: str, keys: Keys) -> Conversion:
    conv = Conversion("responses")
    for line_no, raw in record_lines(path, conv):
        conv.records += 1
        record, error = load_line(raw)
        if error is not None:
            conv.problem(line_no, None, None, error, raw)
            continue
        try:
            conv.calls.append(record_to_call(record, keys, line_no))
        except Invalid as exc:
            conv.problem(line_no, None, exc.field, exc.message, raw)
        except RecursionError:
            conv.problem(line_no, None, None, "nested too deeply", raw)
    return conv


def looks_like_responses(record: dict) -> bool:
    """`{"request": <responses.create body>, ...}` or `{..., "response": <Response>}`, not a Chat Completions
    request (which has `messages`) nor an OTLP export."""
    if isinstance(record.get("resourceSpans"), list) or ("request" not in record and "response" not in record):
        return False
    request, response = record.get("request"), record.get("response")
    if isinstance(request, dict) and "messages" in request:
        return False
    if isinstance(request, dict) and ("input" in request or "instructions" in request):
        return True
    return isinstance(response, dict) and (response.get("object") == "response"
                                           or isinstance(response.get("output"), list))


def detect(sample: Sample) -> bool:
    return isinstance(sample.value, dict) and looks_like_responses(sample.value)


FORMAT = TraceFormat(name="responses", description="OpenAI Responses API logs, one {request, response} per line",
                     detect=detect, read=read, record_word="record", looks_like="a Responses API log line")


def record_to_call(record: Any, keys: Keys, line: int) -> Call:
    if not isinstance(record, dict):
        raise Invalid(None, f"line must be a JSON object, got {type(record).__name__}")
    if not isinstance(record.get("request"), dict):
        raise Invalid("request", "missing or not an object: each line is {\"request\": <responses.create body>, "
                                 "\"response\": <Response>}" + mixed(record, "responses"))
    body = record["request"]
    if "input" not in body:
        raise Invalid("request.input", "missing: a Responses API request has input items" + mixed(record, "responses"))
    response = record.get("response")
    if response is not None and not isinstance(response, dict):
        raise Invalid("response", f"must be an object, got {type(response).__name__}")
    session_key = keys.session or DEFAULT_SESSION_KEY
    session = as_key(_lookup(record, session_key))
    if session is None:
        raise Invalid(session_key, "missing or not a string: cannot tell which session this call belongs to "
                                   "(use --session-key to name another field)")
    customer = as_key(_lookup(record, keys.customer or DEFAULT_CUSTOMER_KEY))
    index = _lookup(record, "request.metadata.call_index")
    request = chat_request(body)
    answer = chat_answer(response) if response is not None else None
    return Call(session, customer, request, answer, Origin(line, None, "response.output"),
                call_index=None if index is None else str(index))


def _lookup(record: dict, dotted: str) -> Any:
    """A dotted path; `request.metadata.*` falls back to `response.metadata.*` (Responses echoes metadata)."""
    value = get_dotted(record, dotted)
    if value is None and dotted.startswith("request.metadata.") and not isinstance(
            get_dotted(record, "request.metadata"), dict):
        value = get_dotted(record, "response." + dotted.removeprefix("request."))
    return value


def chat_request(body: dict) -> dict:
    request: dict[str, Any] = {k: body[k] for k in _COPIED if k in body}
    messages: list[dict] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str):
        messages.append({"role": "system", "content": instructions})
    elif instructions is not None:
        raise Invalid("request.instructions", f"must be a string, got {type(instructions).__name__}")
    items = body.get("input")
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
    elif isinstance(items, list):
        calls: list | None = None  # the tool_calls of the assistant message that function_call items extend
        for i, item in enumerate(items):
            calls = _input_item(messages, item, f"request.input[{i}]", calls)
    else:
        raise Invalid("request.input", f"must be a string or a list of items, got {type(items).__name__}")
    request["messages"] = messages
    if body.get("tools") is not None:
        request["tools"] = chat_tools(body["tools"], "request.tools")
    if "max_output_tokens" in body:
        request["max_tokens"] = body["max_output_tokens"]
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        request["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    elif choice is not None:
        request["tool_choice"] = choice
    if isinstance(body.get("metadata"), dict):
        request["metadata"] = body["metadata"]
    return request


def _input_item(messages: list[dict], item: Any, at: str, calls: list | None) -> list | None:
    """Append one input item; returns the open assistant turn's tool_calls (consecutive calls share it)."""
    if not isinstance(item, dict):
        raise Invalid(at, f"must be an object, got {type(item).__name__}")
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        role = check_role(item.get("role"), f"{at}.role")
        messages.append({"role": role, "content": _content(item.get("content"), f"{at}.content")})
        return [] if role == "assistant" else None
    if kind == "function_call":
        call = _function_call(item, at)
        if calls is None:
            calls = []
            messages.append({"role": "assistant", "content": None})
        if not calls:
            messages[-1]["tool_calls"] = calls
        calls.append(call)
        return calls
    if kind == "function_call_output":
        output = item.get("output")
        tool = {"role": "tool", "content": output if isinstance(output, str) else arguments_text(output)}
        if as_key(item.get("call_id")) is not None:
            tool["tool_call_id"] = as_key(item["call_id"])
        messages.append(tool)
    elif kind is None:
        raise Invalid(f"{at}.type", "missing: an input item needs a type (or a role)")
    # reasoning, item references, built-in tool calls: not part of what the drift is measured on
    return None


def _content(content: Any, at: str) -> Any:
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise Invalid(at, f"must be a string or a list of parts, got {type(content).__name__}")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            raise Invalid(f"{at}[{j}]", f"must be an object, got {type(part).__name__}")
        if part.get("type") in _TEXT_PARTS:
            if not isinstance(part.get("text"), str):
                raise Invalid(f"{at}[{j}].text", "a text part needs a string text")
            texts.append(part["text"])
    return text_content(texts)


def _function_call(item: dict, at: str) -> dict:
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise Invalid(f"{at}.name", "missing: a function_call needs the tool's name")
    call: dict[str, Any] = {"type": "function",
                            "function": {"name": name, "arguments": arguments_text(item.get("arguments"))}}
    call_id = as_key(item.get("call_id")) or as_key(item.get("id"))
    return {"id": call_id, **call} if call_id is not None else call


def chat_answer(response: dict) -> dict:
    output = response.get("output")
    if not isinstance(output, list):
        raise Invalid("response.output", f"must be a list of output items, got {type(output).__name__}")
    texts: list[str] = []
    calls: list[dict] = []
    for i, item in enumerate(output):
        at = f"response.output[{i}]"
        if not isinstance(item, dict):
            raise Invalid(at, f"must be an object, got {type(item).__name__}")
        if item.get("type") == "message":
            content = _content(item.get("content"), f"{at}.content")
            if isinstance(content, str):
                texts.append(content)
            elif isinstance(content, list):
                texts.extend(p["text"] for p in content)
        elif item.get("type") == "function_call":
            calls.append(_function_call(item, at))
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    finish = None
    details = response.get("incomplete_details")
    if not calls and response.get("status") == "incomplete" and isinstance(details, dict):
        finish = "length" if details.get("reason") == "max_output_tokens" else details.get("reason")
    usage = response.get("usage") if isinstance(response.get("usage"), dict) else {}
    return chat_response(message, finish, response.get("id"), response.get("model"), response.get("created_at"),
                         usage_block(usage.get("input_tokens"), usage.get("output_tokens")))
