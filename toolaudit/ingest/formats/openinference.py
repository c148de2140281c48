"""OpenInference LLM spans (Arize Phoenix and the OpenInference instrumentations), from an OTLP/JSON export.

A call is a span whose `openinference.span.kind` is `LLM`; every other span (CHAIN, TOOL, AGENT, RETRIEVER...)
is skipped with its reason. Messages are flattened attributes: `llm.input_messages.N.message.role|content|name|
tool_call_id`, text items `...message.contents.M.message_content.text`, tool calls
`...message.tool_calls.M.tool_call.id|function.name|function.arguments`, and the answer in
`llm.output_messages.0.message.*`. Tools are `llm.tools.N.tool.json_schema` (a JSON tool definition), the model
`llm.model_name`, request parameters `llm.invocation_parameters` (a JSON object). The session is `session.id`,
the customer `user.id` (`--session-key` / `--customer-key` name other attributes, or a key inside a JSON
attribute: `metadata.customer`), on the span, else its parent spans, else any span of its trace; else the
session is the trace id.

A gap in a flattened list (`.0` and `.2` but no `.1`) is an error: SDK attribute limits drop attributes
silently, and a conversation with a hole is not the one the model saw.
"""

from __future__ import annotations

from typing import Any

from toolaudit.ingest.formats.base import (
    Call,
    Invalid,
    Keys,
    Origin,
    arguments_text,
    as_key,
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

KIND = "openinference.span.kind"
SESSION_ATTR = "session.id"
CUSTOMER_ATTRS = ("user.id",)
INPUT, OUTPUT, TOOLS = "llm.input_messages", "llm.output_messages", "llm.tools"
CONTEXT = Context((SESSION_ATTR,), CUSTOMER_ATTRS)
_RESERVED = {"messages", "tools", "metadata", "model"}


def detect(sample: Sample) -> bool | None:
    return detect_convention(sample, "openinference")


def span_to_call(span: Span, keys: Keys) -> Call | str:
    kind = span.attr(KIND)
    if kind is None:
        return f"no {KIND}"
    if str(kind).upper() != "LLM":
        return f"{KIND} {kind!r}"
    span.check_times()
    # inherited from the span's parents or its trace when the span has none (`otlp_export.Context`)
    session = span.session(keys, SESSION_ATTR) or span.trace_id
    customer = span.customer(keys, CUSTOMER_ATTRS)
    attrs = {**span.resource, **span.attributes}
    request: dict[str, Any] = {}
    if span.attr("llm.model_name") is not None:
        request["model"] = span.attr("llm.model_name")
    request["messages"] = [_message(m, f"{INPUT}.{i}.message") for i, m in enumerate(_indexed(attrs, INPUT))]
    tools = _indexed(attrs, TOOLS)
    if tools:
        request["tools"] = []
        for i, tool in enumerate(tools):
            at = f"{TOOLS}.{i}.tool.json_schema"
            schema = (tool.get("tool") or {}).get("json_schema") if isinstance(tool.get("tool"), dict) else None
            if schema is None:
                raise Invalid(at, "missing: each tool needs its JSON definition")
            request["tools"].extend(tools_from_json(schema, at, single=True) if isinstance(schema, str) else
                                    chat_tools([json_value(schema, at)], at))
    params = span.attr("llm.invocation_parameters")
    if params is not None:
        params = json_value(params, "llm.invocation_parameters")
        if not isinstance(params, dict):
            raise Invalid("llm.invocation_parameters", f"must be a JSON object, got {type(params).__name__}")
        request.update({k: v for k, v in params.items() if k not in _RESERVED})
    outputs = _indexed(attrs, OUTPUT)
    response = None
    if outputs:
        answer = _message(outputs[0], f"{OUTPUT}.0.message")
        usage = usage_block(span.attr("llm.token_count.prompt"), span.attr("llm.token_count.completion"))
        response = chat_response(answer, None, model=span.attr("llm.model_name"),
                                 created=span.start // 1_000_000_000 if span.start else None, usage=usage)
    return Call(session, customer, request, response, Origin(span.line, span.span_id, OUTPUT), order=span.order())


def _indexed(attrs: dict[str, Any], prefix: str) -> list[dict]:
    """`prefix.N.rest...` attributes -> a list (by N) of nested dicts of the rest. A gap is an error."""
    items: dict[int, dict] = {}
    start = prefix + "."
    for key, value in attrs.items():
        if not key.startswith(start):
            continue
        head, _, rest = key[len(start):].partition(".")
        if not head.isdigit() or not rest:
            raise Invalid(key, f"expected {prefix}.<index>.<attribute>")
        _put(items.setdefault(int(head), {}), rest.split("."), value, key)
    return _as_list(items, prefix)


def _put(tree: dict, parts: list[str], value: Any, key: str) -> None:
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise Invalid(key, "conflicts with another attribute that gives this path a value")
        node = child
    if isinstance(node.get(parts[-1]), dict):
        raise Invalid(key, "conflicts with attributes nested under it")
    node[parts[-1]] = value


def _as_list(items: dict, where: str) -> list:
    if not items:
        return []
    for i in range(max(items) + 1):
        if i not in items:
            raise Invalid(f"{where}.{i}", f"missing while {where}.{max(items)} exists (attributes dropped, e.g. by "
                                          "an SDK attribute count limit?)")
    return [items[i] for i in range(len(items))]


def _numbered(node: Any, where: str) -> list:
    """A nested `{"0": {...}, "1": {...}}` (from flattened indices) as a list; a gap is an error."""
    if node is None:
        return []
    if not isinstance(node, dict) or not all(k.isdigit() for k in node):
        raise Invalid(where, "expected numbered items (.0, .1, ...)")
    return _as_list({int(k): v for k, v in node.items()}, where)


def _message(item: dict, where: str) -> dict:
    message = item.get("message")
    if not isinstance(message, dict):
        raise Invalid(where, "missing: expected message.role, message.content ...")
    role = check_role(message.get("role"), f"{where}.role")
    content = message.get("content")
    if content is None and message.get("contents") is not None:
        texts = []
        for entry in _numbered(message["contents"], f"{where}.contents"):
            block = entry.get("message_content") if isinstance(entry, dict) else None
            if isinstance(block, dict) and block.get("type", "text") == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
        content = text_content(texts)
    elif content is not None and not isinstance(content, str):
        content = arguments_text(content)
    out: dict[str, Any] = {"role": role, "content": content}
    for name in ("name", "tool_call_id"):
        if as_key(message.get(name)) is not None:
            out[name] = as_key(message[name])
    calls = []
    for k, entry in enumerate(_numbered(message.get("tool_calls"), f"{where}.tool_calls")):
        at = f"{where}.tool_calls.{k}.tool_call"
        call = entry.get("tool_call") if isinstance(entry, dict) else None
        fn = call.get("function") if isinstance(call, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            raise Invalid(f"{at}.function.name", "missing: a tool call needs the tool's name")
        converted: dict[str, Any] = {"type": "function",
                                     "function": {"name": name, "arguments": arguments_text(fn.get("arguments"))}}
        if as_key(call.get("id")) is not None:
            converted = {"id": as_key(call["id"]), **converted}
        calls.append(converted)
    if calls:
        out["tool_calls"] = calls
    return out


FORMAT = TraceFormat(name="openinference", description="OpenInference LLM spans (Phoenix) in OTLP/JSON exports, "
                     "one export request per line", detect=detect,
                     open=open_export("openinference", span_to_call, CONTEXT), record_word="span",
                     looks_like="an OpenInference (OTLP/JSON) export")
