"""OpenTelemetry GenAI spans (semantic conventions for generative AI) from an OTLP/JSON export.

A call is a span whose `gen_ai.operation.name` is `chat`; every other span is skipped with its reason.
Messages come from `gen_ai.system_instructions`, `gen_ai.input.messages` and `gen_ai.output.messages` (JSON
arrays of `{role, parts}`, parts `text`, `tool_call` {id, name, arguments} and `tool_call_response` {id,
response}), or, in the older event form, from `gen_ai.system.message`, `gen_ai.user.message`,
`gen_ai.assistant.message`, `gen_ai.tool.message` and `gen_ai.choice` span events. Tools come from
`gen_ai.tool.definitions`. Content carried by log records instead is joined to the span first (`otlp_logs`).
The session is `gen_ai.conversation.id`, else `session.id`, else OpenLLMetry's association property
`session_id`; the customer `user.id`, else `enduser.id`, else the association property `customer_id` / `user_id`;
`--session-key` / `--customer-key` name other attributes. They are looked up on the span, then on its resource,
then inherited from its parent spans or its trace (`otlp_export.Context`), else the session is the trace id.
"""

from __future__ import annotations

from typing import Any

from toolaudit.ingest.formats.base import (
    Call,
    Invalid,
    Keys,
    Origin,
    arguments_text,
    as_int,
    chat_response,
    chat_tools,
    check_role,
    json_value,
    text_content,
    tools_from_json,
    usage_block,
)
from toolaudit.ingest.formats.contract import Sample, TraceFormat
from toolaudit.ingest.formats.otlp import Span, detect_convention
from toolaudit.ingest.formats.otlp_export import open_export
from toolaudit.ingest.formats.span_family import Context

# OpenLLMetry (traceloop-sdk) copies its association properties onto every span as
# `traceloop.association.properties.<key>`; baggage span processors copy `session.id` / `user.id`.
_ASSOCIATION = "traceloop.association.properties."
SESSION_ATTRS = ("gen_ai.conversation.id", "session.id", _ASSOCIATION + "session_id")
CUSTOMER_ATTRS = ("user.id", "enduser.id", _ASSOCIATION + "customer_id", _ASSOCIATION + "user_id")
CONTEXT = Context(SESSION_ATTRS, CUSTOMER_ATTRS)
INPUT, OUTPUT, SYSTEM = "gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions"
_EVENT_ROLES = {"gen_ai.system.message": "system", "gen_ai.user.message": "user",
                "gen_ai.assistant.message": "assistant", "gen_ai.tool.message": "tool"}
_PARAMS = {"gen_ai.request.temperature": "temperature", "gen_ai.request.max_tokens": "max_tokens",
           "gen_ai.request.top_p": "top_p", "gen_ai.request.seed": "seed",
           "gen_ai.request.frequency_penalty": "frequency_penalty",
           "gen_ai.request.presence_penalty": "presence_penalty", "gen_ai.request.stop_sequences": "stop"}
_FINISH = {"tool_call": "tool_calls", "tool_calls": "tool_calls", "stop": "stop", "length": "length",
           "content_filter": "content_filter", "error": "error"}


def detect(sample: Sample) -> bool | None:
    return detect_convention(sample, "otel")


def span_to_call(span: Span, keys: Keys) -> Call | str:
    operation = span.attr("gen_ai.operation.name")
    if operation is None:
        return "no gen_ai.operation.name"
    if operation != "chat":
        return f"gen_ai.operation.name {operation!r}"
    span.check_times()
    # read alone, a span without them is its trace's session; in an export the session and customer may also be
    # inherited from the span's parents or its trace (`otlp_export.Context`)
    session = span.session(keys, SESSION_ATTRS) or span.trace_id
    customer = span.customer(keys, CUSTOMER_ATTRS)
    if any(span.attr(a) is not None for a in (INPUT, OUTPUT, SYSTEM)):
        messages, answer, finish = _from_attributes(span)
        answer_field = OUTPUT
    else:
        messages, answer, finish = _from_events(span)
        answer_field = "gen_ai.choice"
    request: dict[str, Any] = {}
    if span.attr("gen_ai.request.model") is not None:
        request["model"] = span.attr("gen_ai.request.model")
    request["messages"] = messages
    tools = span.attr("gen_ai.tool.definitions")
    if tools is not None:
        request["tools"] = (tools_from_json(tools, "gen_ai.tool.definitions") if isinstance(tools, str) else
                            chat_tools(json_value(tools, "gen_ai.tool.definitions"), "gen_ai.tool.definitions"))
    for attr, name in _PARAMS.items():
        if span.attr(attr) is not None:
            request[name] = span.attr(attr)
    response = None
    if answer is not None:
        reasons = span.attr("gen_ai.response.finish_reasons")
        if finish is None and isinstance(reasons, list) and reasons:
            finish = reasons[0]
        usage = usage_block(span.attr("gen_ai.usage.input_tokens"), span.attr("gen_ai.usage.output_tokens"))
        response = chat_response(answer, _FINISH.get(finish, finish) if isinstance(finish, str) else None,
                                 span.attr("gen_ai.response.id"), span.attr("gen_ai.response.model"),
                                 span.start // 1_000_000_000 if span.start else None, usage,
                                 span.attr("openai.response.system_fingerprint")
                                 or span.attr("gen_ai.openai.response.system_fingerprint"))
    return Call(session, customer, request, response, Origin(span.line, span.span_id, answer_field),
                order=span.order())


def _from_attributes(span: Span) -> tuple[list[dict], dict | None, Any]:
    messages: list[dict] = []
    system = span.attr(SYSTEM)
    if system is not None:
        system = json_value(system, span.where(SYSTEM))
        if isinstance(system, str):
            system = [{"type": "text", "content": system}]
        texts, _, _ = _parts(system, span.where(SYSTEM))
        messages.append({"role": "system", "content": text_content(texts)})
    if span.attr(INPUT) is not None:
        messages.extend(_messages(span.attr(INPUT), span.where(INPUT)))
    output = span.attr(OUTPUT)
    if output is None:
        return messages, None, None
    where = span.where(OUTPUT)
    output = json_value(output, where)
    if not isinstance(output, list):
        raise Invalid(where, f"must be a JSON array of messages, got {type(output).__name__}")
    if not output:
        return messages, None, None
    answers = _messages(output[:1], where)
    first = output[0]
    return messages, answers[0] if answers else None, first.get("finish_reason")


def _messages(value: Any, where: str) -> list[dict]:
    value = json_value(value, where)
    if not isinstance(value, list):
        raise Invalid(where, f"must be a JSON array of messages, got {type(value).__name__}")
    out: list[dict] = []
    for i, message in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(message, dict):
            raise Invalid(at, f"must be an object, got {type(message).__name__}")
        role = check_role(message.get("role"), f"{at}.role")
        parts = message.get("parts")
        if parts is None and isinstance(message.get("content"), str):
            parts = [{"type": "text", "content": message["content"]}]
        if not isinstance(parts, list):
            raise Invalid(f"{at}.parts", "must be a list of message parts")
        texts, calls, results = _parts(parts, at + ".parts")
        if results:
            for call_id, content in results:
                tool = {"role": "tool", "content": content}
                if call_id is not None:
                    tool["tool_call_id"] = call_id
                out.append(tool)
            continue
        converted: dict[str, Any] = {"role": role, "content": text_content(texts)}
        if calls:
            converted["tool_calls"] = calls
        if isinstance(message.get("name"), str):
            converted["name"] = message["name"]
        out.append(converted)
    return out


def _parts(parts: Any, where: str) -> tuple[list[str], list[dict], list[tuple[Any, Any]]]:
    """Text, tool calls and tool results of a message's parts; other part kinds (media, reasoning) are left."""
    if not isinstance(parts, list):
        raise Invalid(where, f"must be a list of parts, got {type(parts).__name__}")
    texts: list[str] = []
    calls: list[dict] = []
    results: list[tuple[Any, Any]] = []
    for j, part in enumerate(parts):
        at = f"{where}[{j}]"
        if not isinstance(part, dict):
            raise Invalid(at, f"must be an object, got {type(part).__name__}")
        kind = part.get("type")
        if kind == "text":
            if not isinstance(part.get("content"), str):
                raise Invalid(f"{at}.content", "a text part needs string content")
            texts.append(part["content"])
        elif kind == "tool_call":
            calls.append(_tool_call(part.get("id"), part.get("name"), part.get("arguments"), at))
        elif kind == "tool_call_response":
            response = part.get("response")
            results.append((part.get("id"), response if isinstance(response, str) else arguments_text(response)))
    return texts, calls, results


def _tool_call(call_id: Any, name: Any, arguments: Any, at: str) -> dict:
    if not isinstance(name, str) or not name:
        raise Invalid(f"{at}.name", "missing: a tool call needs the tool's name")
    call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": arguments_text(arguments)}}
    if call_id is not None:
        call = {"id": str(call_id), **call}
    return call


# -- the older event form --------------------------------------------------------------------------------------

def _from_events(span: Span) -> tuple[list[dict], dict | None, Any]:
    messages: list[dict] = []
    answer, finish = None, None
    events = sorted(enumerate(span.events), key=lambda e: (e[1]["time"] or 0, e[0]))
    for _, event in events:
        name, body = event["name"], event["attributes"]
        if name in _EVENT_ROLES:
            messages.append(_event_message(_EVENT_ROLES[name], body, name))
        elif name == "gen_ai.choice" and answer is None and as_int(body.get("index", 0)) in (0, None):
            message = json_value(body.get("message", {}), "gen_ai.choice.message")
            if not isinstance(message, dict):
                raise Invalid("gen_ai.choice.message", "must be an object")
            answer = _event_message("assistant", message, "gen_ai.choice.message")
            finish = body.get("finish_reason")
    return messages, answer, finish


def _event_message(role: str, body: dict, where: str) -> dict:
    content = body.get("content")
    if content is not None and not isinstance(content, str):
        content = arguments_text(content)
    message: dict[str, Any] = {"role": role, "content": content}
    if role == "tool" and body.get("id") is not None:
        message["tool_call_id"] = str(body["id"])
    calls = json_value(body.get("tool_calls"), f"{where}.tool_calls") if body.get("tool_calls") is not None else []
    if not isinstance(calls, list):
        raise Invalid(f"{where}.tool_calls", "must be a list")
    converted = []
    for k, call in enumerate(calls):
        at = f"{where}.tool_calls[{k}]"
        if not isinstance(call, dict):
            raise Invalid(at, "must be an object")
        fn = call.get("function") if isinstance(call.get("function"), dict) else call
        converted.append(_tool_call(call.get("id"), fn.get("name"), fn.get("arguments"), f"{at}.function"))
    if converted:
        message["tool_calls"] = converted
    return message


FORMAT = TraceFormat(name="otel", description="OTel GenAI spans in OTLP/JSON exports, one export request per line",
                     detect=detect, open=open_export("otel", span_to_call, CONTEXT), record_word="span",
                     looks_like="an OTel GenAI (OTLP/JSON) export")
