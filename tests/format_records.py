"""Small, hand-made records in each trace format (one model call each), for reader and bad-input tests.

Every builder returns a plain dict (write it with conftest.write_jsonl); keyword arguments change one thing so
that a test can break exactly the attribute it is about.
"""

from __future__ import annotations

import json

from conftest import CLOSE_TOOL, SEARCH_TOOL

TOOLS = [SEARCH_TOOL, CLOSE_TOOL]
FLAT_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]
SECOND = 10**9


def value(v) -> dict:
    if v is None:
        return {}
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, str):
        return {"stringValue": v}
    if isinstance(v, list):
        return {"arrayValue": {"values": [value(x) for x in v]}}
    return {"kvlistValue": {"values": [{"key": k, "value": value(x)} for k, x in v.items()]}}


def kv(mapping: dict) -> list[dict]:
    return [{"key": k, "value": v if isinstance(v, dict) and _is_any(v) else value(v)}
            for k, v in mapping.items() if v is not None]


def _is_any(v: dict) -> bool:
    return len(v) == 1 and next(iter(v)).endswith("Value")


def otlp(*spans: dict, resource: dict | None = None) -> dict:
    """One ExportTraceServiceRequest line."""
    return {"resourceSpans": [{"resource": {"attributes": kv({"service.name": "agent", **(resource or {})})},
                               "scopeSpans": [{"scope": {"name": "test"}, "spans": list(spans)}]}]}


def span(span_id: str, attributes: dict, trace_id: str = "t" * 32, start: int | None = 1,
         end: int | None = 2, events: list | None = None, **fields) -> dict:
    out = {"traceId": trace_id, "spanId": span_id, "name": "chat m", "attributes": kv(attributes), **fields}
    if start is not None:
        out["startTimeUnixNano"] = str(start * SECOND)
    if end is not None:
        out["endTimeUnixNano"] = str(end * SECOND)
    if events is not None:
        out["events"] = events
    return out


def otel_attrs(session: str | None = "s1", customer: str | None = "acme",
               calls=(("close_ticket", {"ticket_id": 1}),), content: str | None = None, **overrides) -> dict:
    parts = [{"type": "text", "content": content}] if content is not None else []
    parts += [{"type": "tool_call", "id": f"call_{i}", "name": name, "arguments": args}
              for i, (name, args) in enumerate(calls)]
    attrs = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m", "gen_ai.conversation.id": session,
             "user.id": customer,
             "gen_ai.system_instructions": json.dumps([{"type": "text", "content": "be brief"}]),
             "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text",
                                                                                "content": "close ticket 1"}]}]),
             "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": parts,
                                                     "finish_reason": "tool_call"}]),
             "gen_ai.tool.definitions": json.dumps(FLAT_TOOLS)}
    attrs.update(overrides)
    return attrs


def otel_span(span_id: str = "a1", start: int = 1, end: int | None = 2, trace_id: str = "t" * 32, **kw) -> dict:
    return span(span_id, otel_attrs(**kw), trace_id=trace_id, start=start, end=end)


def oi_attrs(session: str | None = "s1", customer: str | None = "acme", name: str | None = "close_ticket",
             arguments: str = '{"ticket_id": 1}', **overrides) -> dict:
    attrs = {"openinference.span.kind": "LLM", "llm.model_name": "m", "session.id": session, "user.id": customer,
             "llm.invocation_parameters": json.dumps({"temperature": 0}),
             "llm.input_messages.0.message.role": "system", "llm.input_messages.0.message.content": "be brief",
             "llm.input_messages.1.message.role": "user", "llm.input_messages.1.message.content": "close ticket 1",
             "llm.output_messages.0.message.role": "assistant",
             "llm.output_messages.0.message.tool_calls.0.tool_call.id": "call_1",
             "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": name,
             "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments": arguments}
    for i, tool in enumerate(TOOLS):
        attrs[f"llm.tools.{i}.tool.json_schema"] = json.dumps(tool)
    attrs.update(overrides)
    return {k: v for k, v in attrs.items() if v is not None}


def oi_span(span_id: str = "b1", start: int = 1, end: int | None = 2, **kw) -> dict:
    return span(span_id, oi_attrs(**kw), start=start, end=end)


def chat_call(name: str = "close_ticket", args=None, call_id: str = "call_1") -> dict:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args if args is not None else {"ticket_id": 1})}}


def generation(obs_id: str = "g1", trace_id: str = "tr1", start: str | None = "2026-01-01T00:00:01.000Z",
               output=None, **fields) -> dict:
    out = {"id": obs_id, "traceId": trace_id, "type": "GENERATION", "name": "chat", "model": "m",
           "modelParameters": {"temperature": "0"},
           "input": {"messages": [{"role": "system", "content": "be brief"},
                                  {"role": "user", "content": "close ticket 1"}], "tools": TOOLS},
           "output": output if output is not None else {"role": "assistant", "content": None,
                                                        "tool_calls": [chat_call()]}}
    if start is not None:
        out["startTime"] = start
    out.update(fields)
    return out


def lf_trace(trace_id: str = "tr1", session: str | None = "s1", user: str | None = "acme",
             observations: list | None = None) -> dict:
    out = {"id": trace_id, "name": "turn", "observations": observations if observations is not None else []}
    if session is not None:
        out["sessionId"] = session
    if user is not None:
        out["userId"] = user
    return out


def responses_record(session: str = "s1", customer: str | None = "acme", name: str | None = "close_ticket",
                     arguments: str = '{"ticket_id": 1}', call_index: int | None = None) -> dict:
    metadata = {"session_id": session}
    if customer is not None:
        metadata["customer"] = customer
    if call_index is not None:
        metadata["call_index"] = str(call_index)
    call = {"type": "function_call", "call_id": "call_1", "arguments": arguments}
    if name is not None:
        call["name"] = name
    return {"request": {"model": "m", "instructions": "be brief", "input": [{"role": "user",
                                                                          "content": "close ticket 1"}],
                        "tools": FLAT_TOOLS, "metadata": metadata},
            "response": {"id": "resp_1", "object": "response", "created_at": 1, "model": "m",
                         "status": "completed", "output": [call],
                         "usage": {"input_tokens": 5, "output_tokens": 3, "total_tokens": 8}}}
