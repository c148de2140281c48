#!/usr/bin/env python3
"""Rewrite the example canary logs (traces/example_{baseline,candidate}.jsonl) in the other trace formats.

The same calls, in the shape each tool exports them, with the noise real exports have:
- otel: OTLP/JSON export requests, one per line, each a batch of shuffled spans: GenAI `chat` spans (messages
  as JSON-string attributes, as structured kvlist/array values, or in the older event form), plus
  `invoke_agent` / `execute_tool` / HTTP spans that are not model calls, and a few spans exported twice;
  the customer sits on the span or on the resource.
- openinference: the same export shape with OpenInference LLM spans (flattened messages, tools as JSON) beside
  CHAIN and TOOL spans.
- langfuse: traces with embedded observations, traces listing observation ids next to observation lines, and
  API pages; GENERATION observations beside SPAN and EVENT ones.
- responses: Responses API request/response pairs, lines shuffled (call order from metadata.call_index).

Comparing a shape's baseline with its candidate must find exactly what comparing the OpenAI logs finds.
Standard library only, seeded: reruns are byte-identical.

    python scripts/make_format_fixtures.py --out-dir /tmp/fixtures [--shapes otel,langfuse] [--sessions N]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHAPES = ("otel", "openinference", "langfuse", "responses")
T0 = 1_767_225_600 * 10**9  # 2026-01-01T00:00:00Z in ns
SEED = 11


def dumps(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def hexid(*parts, n: int = 16) -> str:
    return hashlib.sha256("\x00".join(map(str, parts)).encode()).hexdigest()[:n]


def load(path: Path, sessions: int | None) -> list[dict]:
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if sessions is not None:
        keep = sorted({r["request"]["metadata"]["session_id"] for r in records})[:sessions]
        records = [r for r in records if r["request"]["metadata"]["session_id"] in keep]
    return records


class Call:
    """One OpenAI-log record, with what every shape needs."""

    def __init__(self, record: dict, session_no: int, rng: random.Random):
        req, resp = record["request"], record["response"]
        meta = req["metadata"]
        self.session, self.customer, self.index = meta["session_id"], meta.get("customer"), int(meta["call_index"])
        self.messages, self.tools, self.model = req["messages"], req.get("tools") or [], req.get("model")
        self.temperature = req.get("temperature")
        self.answer = resp["choices"][0]["message"]
        self.finish = resp["choices"][0].get("finish_reason")
        self.response, self.request = resp, req
        self.start = T0 + session_no * 3600 * 10**9 + self.index * 10 * 10**9 + rng.randrange(10**9)
        self.end = self.start + rng.randrange(2 * 10**8, 3 * 10**9)
        self.trace_id = hexid(self.session, self.index, "trace", n=32)
        self.span_id = hexid(self.session, self.index, "span")


def args_value(raw: str):
    """Tool-call arguments as OTel records them: the parsed object when the string is JSON, else the string."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw


# ---------------------------------------------------------------- OTLP helpers


def any_value(value) -> dict:
    if value is None:
        return {}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, list):
        return {"arrayValue": {"values": [any_value(v) for v in value]}}
    return {"kvlistValue": {"values": [{"key": k, "value": any_value(v)} for k, v in value.items()]}}


def attrs(mapping: dict) -> list[dict]:
    return [{"key": k, "value": any_value(v)} for k, v in mapping.items() if v is not None]


def span(trace_id: str, span_id: str, name: str, start: int, end: int, attributes: dict, parent: str | None = None,
         events: list | None = None) -> dict:
    out = {"traceId": trace_id, "spanId": span_id, "name": name, "kind": 3 if name.startswith("chat") else 1,
           "startTimeUnixNano": str(start), "endTimeUnixNano": str(end), "attributes": attrs(attributes),
           "status": {}}
    if parent:
        out["parentSpanId"] = parent
    if events:
        out["events"] = events
    return out


def export_lines(items: list[tuple[dict, dict]], rng: random.Random, service: str) -> list[str]:
    """(resource attributes, span) pairs, shuffled and batched into ExportTraceServiceRequest lines."""
    rng.shuffle(items)
    lines = []
    for at in range(0, len(items), 25):
        groups: dict[str, tuple[dict, list]] = {}
        for resource, sp in items[at:at + 25]:
            key = dumps(resource)
            groups.setdefault(key, (resource, []))[1].append(sp)
        lines.append(dumps({"resourceSpans": [
            {"resource": {"attributes": attrs({"service.name": service, **resource})},
             "scopeSpans": [{"scope": {"name": f"{service}.instrumentation", "version": "1.0"}, "spans": spans}]}
            for resource, spans in groups.values()]}))
    return lines


# ---------------------------------------------------------------- OTel GenAI


def otel_parts(message: dict) -> list[dict]:
    parts = []
    if message.get("role") == "tool":
        return [{"type": "tool_call_response", "id": message.get("tool_call_id"), "response": message["content"]}]
    if message.get("content") is not None:
        parts.append({"type": "text", "content": message["content"]})
    for tc in message.get("tool_calls") or []:
        parts.append({"type": "tool_call", "id": tc["id"], "name": tc["function"]["name"],
                      "arguments": args_value(tc["function"]["arguments"])})
    return parts


def otel_spans(call: Call, n: int, rng: random.Random) -> list[tuple[dict, dict]]:
    on_resource = n % 2 == 1  # the customer: on the resource for odd sessions, on the span for even ones
    resource = {"user.id": call.customer} if on_resource else {}
    system = [m for m in call.messages if m["role"] == "system"]
    rest = [m for m in call.messages if m["role"] != "system"]
    answer = {"role": "assistant", "parts": otel_parts(call.answer),
              "finish_reason": "tool_call" if call.finish == "tool_calls" else call.finish}
    a = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": call.model,
         "gen_ai.request.temperature": float(call.temperature) if call.temperature is not None else None,
         "gen_ai.conversation.id": call.session, "user.id": None if on_resource else call.customer,
         "gen_ai.tool.definitions": dumps([{"type": "function", **t["function"]} for t in call.tools]),
         "gen_ai.response.id": call.response.get("id"), "gen_ai.response.model": call.response.get("model"),
         "gen_ai.response.finish_reasons": [call.finish],
         "gen_ai.usage.input_tokens": call.response["usage"]["prompt_tokens"],
         "gen_ai.usage.output_tokens": call.response["usage"]["completion_tokens"],
         "openai.response.system_fingerprint": call.response.get("system_fingerprint")}
    events = None
    style = (n * 7 + call.index) % 5
    if style == 4:  # the older event form
        events = [{"timeUnixNano": str(call.start + i), "name": f"gen_ai.{m['role']}.message",
                   "attributes": attrs({"content": m.get("content"), "id": m.get("tool_call_id"),
                                        "tool_calls": dumps(m["tool_calls"]) if m.get("tool_calls") else None})}
                  for i, m in enumerate(call.messages)]
        events.append({"timeUnixNano": str(call.end), "name": "gen_ai.choice", "attributes": attrs(
            {"index": 0, "finish_reason": call.finish, "message": {
                "role": "assistant", "content": call.answer.get("content"),
                **({"tool_calls": call.answer["tool_calls"]} if call.answer.get("tool_calls") else {})}})})
    else:
        a["gen_ai.system_instructions"] = dumps([{"type": "text", "content": m["content"]} for m in system])
        a["gen_ai.input.messages"] = dumps([{"role": m["role"], "parts": otel_parts(m)} for m in rest])
        # structured (kvlist/array) values for some spans, JSON strings for the others
        a["gen_ai.output.messages"] = [answer] if style == 1 else dumps([answer])
    chat = span(call.trace_id, call.span_id, f"chat {call.model}", call.start, call.end, a, events=events)
    noise = [span(call.trace_id, hexid(call.span_id, "tool"), "execute_tool", call.end, call.end + 5 * 10**8,
                  {"gen_ai.operation.name": "execute_tool", "gen_ai.conversation.id": call.session},
                  parent=call.span_id),
             span(call.trace_id, hexid(call.span_id, "http"), "POST /v1/chat/completions", call.start + 10,
                  call.end - 10, {"http.request.method": "POST", "server.address": "llm.internal"},
                  parent=call.span_id)]
    if call.index == 0:
        noise.append(span(call.trace_id, hexid(call.span_id, "agent"), "invoke_agent", call.start - 10**6,
                          call.end + 10**9, {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "ops"}))
    items = [(resource, chat)] + [(resource, s) for s in noise]
    if (n + call.index) % 17 == 0:
        items.append((resource, chat))  # the same span exported twice (a retried batch)
    return items


# ---------------------------------------------------------------- OpenInference


def oi_message(prefix: str, message: dict, contents: bool) -> dict:
    out = {f"{prefix}.message.role": message["role"]}
    if message.get("content") is not None:
        if contents:
            out[f"{prefix}.message.contents.0.message_content.type"] = "text"
            out[f"{prefix}.message.contents.0.message_content.text"] = message["content"]
        else:
            out[f"{prefix}.message.content"] = message["content"]
    if message.get("tool_call_id"):
        out[f"{prefix}.message.tool_call_id"] = message["tool_call_id"]
    for k, tc in enumerate(message.get("tool_calls") or []):
        at = f"{prefix}.message.tool_calls.{k}.tool_call"
        out.update({f"{at}.id": tc["id"], f"{at}.function.name": tc["function"]["name"],
                    f"{at}.function.arguments": tc["function"]["arguments"]})
    return out


def openinference_spans(call: Call, n: int, rng: random.Random) -> list[tuple[dict, dict]]:
    a = {"openinference.span.kind": "LLM", "llm.model_name": call.model, "llm.provider": "openai",
         "llm.invocation_parameters": dumps({"temperature": call.temperature, "tool_choice": "auto"}),
         "session.id": call.session, "user.id": call.customer,
         "llm.token_count.prompt": call.response["usage"]["prompt_tokens"],
         "llm.token_count.completion": call.response["usage"]["completion_tokens"]}
    for i, m in enumerate(call.messages):
        a.update(oi_message(f"llm.input_messages.{i}", m, contents=(n + i) % 4 == 0 and m["role"] == "user"))
    a.update(oi_message("llm.output_messages.0", call.answer, contents=False))
    for i, t in enumerate(call.tools):
        a[f"llm.tools.{i}.tool.json_schema"] = dumps(t)
    chat = span(call.trace_id, call.span_id, "ChatCompletion", call.start, call.end, a)
    noise = [span(call.trace_id, hexid(call.span_id, "chain"), "agent.run", call.start - 10**6, call.end + 10**9,
                  {"openinference.span.kind": "CHAIN", "session.id": call.session}),
             span(call.trace_id, hexid(call.span_id, "tool"), "tool", call.end, call.end + 10**8,
                  {"openinference.span.kind": "TOOL", "tool.name": "lookup"}, parent=call.span_id)]
    items = [({}, chat)] + [({}, s) for s in noise]
    if (n + call.index) % 19 == 0:
        items.append(({}, chat))
    return items


# ---------------------------------------------------------------- Langfuse


def iso(ns: int) -> str:
    moment = datetime.fromtimestamp(ns / 1e9, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ns // 10**6 % 1000:03d}Z"


def langfuse_lines(calls: list[tuple[int, Call]], rng: random.Random) -> list[str]:
    lines = []
    for n, call in calls:
        trace_id = f"tr-{hexid(call.session, call.index)}"
        gen = {"id": f"gen-{call.span_id}", "traceId": trace_id, "type": "GENERATION", "name": "chat",
               "startTime": iso(call.start), "endTime": iso(call.end), "model": call.model,
               "modelParameters": {"temperature": str(call.temperature) if n % 3 == 0 else call.temperature,
                                   "tool_choice": "auto"},
               "input": {"messages": call.messages, "tools": call.tools},
               "output": call.response if n % 4 == 0 else call.answer,
               "usage": {"input": call.response["usage"]["prompt_tokens"],
                         "output": call.response["usage"]["completion_tokens"], "unit": "TOKENS"},
               "level": "DEFAULT"}
        others = [{"id": f"span-{call.span_id}", "traceId": trace_id, "type": "SPAN", "name": "execute_tool",
                   "startTime": iso(call.end), "endTime": iso(call.end + 10**8)},
                  {"id": f"evt-{call.span_id}", "traceId": trace_id, "type": "EVENT", "name": "user_feedback",
                   "startTime": iso(call.end + 10**8)}]
        trace = {"id": trace_id, "name": "agent-turn", "timestamp": iso(call.start), "sessionId": call.session,
                 "userId": call.customer, "tags": ["canary"]}
        style = (n + call.index) % 3
        if style == 0:  # the trace with its observations embedded
            lines.append(dumps({**trace, "observations": [gen, *others]}))
        elif style == 1:  # the trace lists ids; each observation is a line of its own
            lines.append(dumps({**trace, "observations": [o["id"] for o in (gen, *others)]}))
            lines.extend(dumps(o) for o in (gen, *others))
        else:  # an API page of observations, and the trace on its own line
            lines.append(dumps({**trace, "observations": []}))
            lines.append(dumps({"data": [gen, *others], "meta": {"page": 1, "totalItems": 3}}))
        if (n + call.index) % 23 == 0:
            lines.append(dumps(gen))  # exported twice
    rng.shuffle(lines)
    return lines


# ---------------------------------------------------------------- Responses API


def responses_line(call: Call, n: int) -> str:
    items = []
    instructions = None
    for i, m in enumerate(call.messages):
        if m["role"] == "system" and i == 0:
            instructions = m["content"]
        elif m["role"] == "tool":
            items.append({"type": "function_call_output", "call_id": m["tool_call_id"], "output": m["content"]})
        elif m["role"] == "assistant":
            if m.get("content") is not None:
                items.append({"type": "message", "role": "assistant",
                              "content": [{"type": "output_text", "text": m["content"]}]})
            items.extend({"type": "function_call", "call_id": tc["id"], "name": tc["function"]["name"],
                          "arguments": tc["function"]["arguments"]} for tc in m.get("tool_calls") or [])
        else:
            content = ([{"type": "input_text", "text": m["content"]}] if (n + i) % 2 else m["content"])
            items.append({"role": m["role"], "content": content})
    request = {"model": call.model, "instructions": instructions, "input": items,
               "tools": [{"type": "function", **t["function"]} for t in call.tools],
               "tool_choice": "auto", "temperature": call.temperature, "metadata": call.request["metadata"]}
    output = []
    if call.answer.get("content") is not None:
        output.append({"type": "message", "id": f"msg_{call.span_id}", "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": call.answer["content"], "annotations": []}]})
    for tc in call.answer.get("tool_calls") or []:
        output.append({"type": "function_call", "id": f"fc_{hexid(tc['id'])}", "call_id": tc["id"],
                       "name": tc["function"]["name"], "arguments": tc["function"]["arguments"],
                       "status": "completed"})
    usage = call.response["usage"]
    cut = call.finish == "length"  # an answer cut at max_tokens: the Responses API calls it incomplete
    response = {"id": f"resp_{call.span_id}", "object": "response", "created_at": call.response["created"],
                "model": call.response.get("model"), "status": "incomplete" if cut else "completed",
                **({"incomplete_details": {"reason": "max_output_tokens"}} if cut else {}), "output": output,
                "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
                          "total_tokens": usage["total_tokens"]}, "metadata": call.request["metadata"]}
    return dumps({"request": request, "response": response})


# ---------------------------------------------------------------- driver


def build(records: list[dict], shape: str, rng: random.Random) -> list[str]:
    sessions = {s: i for i, s in enumerate(sorted({r["request"]["metadata"]["session_id"] for r in records}))}
    calls = [(sessions[r["request"]["metadata"]["session_id"]],
              Call(r, sessions[r["request"]["metadata"]["session_id"]], rng)) for r in records]
    if shape == "otel":
        return export_lines([item for n, c in calls for item in otel_spans(c, n, rng)], rng, "support-agent")
    if shape == "openinference":
        return export_lines([item for n, c in calls for item in openinference_spans(c, n, rng)], rng, "phoenix-app")
    if shape == "langfuse":
        return langfuse_lines(calls, rng)
    lines = [responses_line(c, n) for n, c in calls]
    rng.shuffle(lines)
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--traces-dir", type=Path, default=REPO / "traces")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--sessions", type=int, help="only the first N sessions (by id)")
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for side in ("baseline", "candidate"):
        records = load(args.traces_dir / f"example_{side}.jsonl", args.sessions)
        for shape in args.shapes.split(","):
            rng = random.Random(f"{SEED}-{shape}-{side}")
            lines = build(records, shape, rng)
            (args.out_dir / f"{shape}_{side}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
