"""Langfuse exports: traces and observations, one JSON object per line.

Accepted lines (they may be mixed in one file, in any order):
- a trace with its observations embedded: `{"id", "sessionId", "userId", "observations": [{...}, ...]}` (the
  shape of `GET /api/public/traces/{id}`); observations listed by id only are expected as lines of their own;
- an observation: `{"id", "traceId", "type", "startTime", "model", "modelParameters", "input", "output",
  "usage"}` (the shape of `GET /api/public/observations`), joined to its trace's line when there is one;
- an API page `{"data": [traces or observations], "meta": {...}}`.

A call is a `GENERATION` observation; other observations (SPAN, EVENT, TOOL...) are skipped with their type.
`input` is a list of Chat messages, `{"messages": [...], "tools": [...]}` (the OpenAI integration's shape) or a
string; `output` an assistant message, a ChatCompletion or a string. The session is the trace's `sessionId`
(else the observation's, else the trace id), the customer the trace's `userId`; `--session-key` /
`--customer-key` name a dotted field of the observation, then of its trace (e.g. `metadata.tenant`). A
session's calls are ordered by `startTime`.
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime, timezone
from typing import Any

from toolaudit.ingest.formats.base import (
    Call,
    Conversion,
    Invalid,
    Keys,
    Origin,
    as_key,
    canonical_bytes,
    chat_response,
    chat_tools,
    check_role,
    get_dotted,
    load_line,
    record_lines,
    usage_block,
)
from toolaudit.ingest.formats.contract import Sample, TraceFormat
from toolaudit.ingest.registry import mixed

LANGFUSE_TYPES = frozenset({"GENERATION", "SPAN", "EVENT", "AGENT", "TOOL", "CHAIN", "RETRIEVER", "EVALUATOR",
                            "EMBEDDING", "GUARDRAIL"})
_NUMERIC_PARAMS = ("temperature", "top_p", "max_tokens", "max_completion_tokens", "frequency_penalty",
                   "presence_penalty", "seed", "n")
_FRACTION = re.compile(r"(\.\d{6})\d+")


def read(path: str, keys: Keys) -> Conversion:
    conv = Conversion("langfuse", by_session=True)
    traces: dict[str, dict] = {}
    found: list[tuple[int, Any, str | None]] = []  # (line, observation, trace id of the enclosing trace)
    for line_no, raw in record_lines(path, conv):
        record, error = load_line(raw)
        if error is None and isinstance(record, dict) and isinstance(record.get("data"), list):
            items = record["data"]
        else:
            items = [record]
        for item in items if error is None else [None]:
            if error is None and isinstance(item, dict) and isinstance(item.get("observations"), list):
                if isinstance(item.get("id"), str):
                    traces.setdefault(item["id"], item)
                found.extend((line_no, obs, item.get("id")) for obs in item["observations"]
                             if not isinstance(obs, str))  # ids only: the observation has a line of its own
            elif error is None and isinstance(item, dict) and looks_like_langfuse(item):
                found.append((line_no, item, None))
            else:
                conv.records += 1
                conv.problem(line_no, None, None, error or (
                    "not a Langfuse trace (with \"observations\") or observation (with \"traceId\" and "
                    "\"type\")" + mixed(item, "langfuse")), raw)
    seen: dict[str, tuple[int, bytes]] = {}
    for position, (line_no, obs, trace_id) in enumerate(found):
        conv.records += 1
        record_id = obs.get("id") if isinstance(obs, dict) and isinstance(obs.get("id"), str) else None
        try:
            result = _observation(obs, trace_id, traces, keys, line_no, position, seen)
        except Invalid as exc:
            conv.problem(line_no, record_id, exc.field, exc.message, obs)
            continue
        except RecursionError:
            conv.problem(line_no, record_id, None, "nested too deeply", obs)
            continue
        if isinstance(result, str):
            conv.skip(result)
        else:
            conv.calls.append(result)
    return conv


def looks_like_langfuse(record: dict) -> bool:
    return isinstance(record.get("observations"), list) or (
        "traceId" in record and ("type" in record or "startTime" in record)) or (
        record.get("type") in LANGFUSE_TYPES and "id" in record)


def detect(sample: Sample) -> bool:
    """A trace (with observations), an observation, or an API page of them; not a log line or an export."""
    record = sample.value
    if not isinstance(record, dict) or "request" in record or "response" in record or isinstance(
            record.get("resourceSpans"), list):
        return False
    if looks_like_langfuse(record):
        return True
    data = record.get("data")
    return isinstance(data, list) and bool(data) and all(isinstance(d, dict) and looks_like_langfuse(d)
                                                         for d in data[:5])


FORMAT = TraceFormat(name="langfuse", description="Langfuse exports: traces, observations or API pages, one per "
                     "line", detect=detect, read=read, record_word="observation",
                     looks_like="a Langfuse export record")


def _observation(obs: Any, trace_id: str | None, traces: dict, keys: Keys, line: int, position: int,
                 seen: dict) -> Call | str:
    if not isinstance(obs, dict):
        raise Invalid("observations", f"an observation must be an object, got {type(obs).__name__}")
    obs_id = obs.get("id")
    if not isinstance(obs_id, str) or not obs_id:
        raise Invalid("id", "missing: every observation needs an id")
    digest = hashlib.blake2b(canonical_bytes(obs), digest_size=16).digest()
    first = seen.get(obs_id)
    if first is not None:
        if first[1] == digest:
            return "duplicate export of an observation"
        raise Invalid("id", f"duplicate observation id (first at line {first[0]}) with different content")
    seen[obs_id] = (line, digest)
    kind = obs.get("type")
    if kind != "GENERATION":
        return f"observation type {kind!r}"
    trace_id = as_key(obs.get("traceId")) or trace_id
    trace = traces.get(trace_id, {}) if trace_id else {}
    session = _session(obs, trace, trace_id, keys)
    customer = _field(obs, trace, keys.customer) if keys.customer else (
        as_key(trace.get("userId")) or as_key(obs.get("userId")))
    start = _time(obs.get("startTime"), "startTime")
    request = _request(obs)
    output = obs.get("output")
    response = None
    if output is not None:
        usage = obs.get("usage") if isinstance(obs.get("usage"), dict) else obs.get("usageDetails")
        usage = usage if isinstance(usage, dict) else {}
        response = chat_response(_answer(output), None, model=obs.get("model"), created=int(start.timestamp()),
                                 usage=usage_block(usage.get("input", usage.get("promptTokens")),
                                                   usage.get("output", usage.get("completionTokens"))))
    return Call(session, customer, request, response, Origin(line, obs_id, "output"),
                order=(start.timestamp(), line, position))


def _field(obs: dict, trace: dict, dotted: str) -> str | None:
    value = as_key(get_dotted(obs, dotted))
    return value if value is not None else as_key(get_dotted(trace, dotted))


def _session(obs: dict, trace: dict, trace_id: str | None, keys: Keys) -> str:
    if keys.session is not None:
        value = _field(obs, trace, keys.session)
        if value is None:
            raise Invalid(keys.session, "missing or not a string on the observation and its trace: cannot tell "
                                        "which session this call belongs to (use --session-key to name another "
                                        "field)")
        return value
    value = as_key(trace.get("sessionId")) or as_key(obs.get("sessionId")) or trace_id
    if value is None:
        raise Invalid("traceId", "missing: without a trace id or a sessionId the call has no session")
    return value


def _time(value: Any, field_name: str) -> datetime:
    if not isinstance(value, str) or not value:
        raise Invalid(field_name, "missing: the call cannot be placed in its session's order")
    text = _FRACTION.sub(r"\1", value.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise Invalid(field_name, f"not an ISO 8601 time: {value!r}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def _request(obs: dict) -> dict:
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


def _answer(output: Any) -> dict:
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
