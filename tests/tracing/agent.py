"""What every instrumentation test records: a few short multi-turn agent sessions, driven through the real `openai`
client against `toolaudit serve` on loopback, and the spans written as a collector's file exporter writes them.

Run as a script in a subprocess per library (`python -m tests.tracing.agent LIBRARY ...`): instrumentation
libraries patch the `openai` module and set global providers, so each gets a fresh interpreter. The library's
own setup (how it attaches the session and the customer) lives in `tests/tracing/libraries.py`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "limit": {"type": "integer"}},
                   "required": ["city"]}}}]
# The served tiny model answers every request with this tool call (a prefilled assistant turn), so tool calls
# appear in both the recorded responses and the following turns' requests, in milliseconds.
PREFILL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "limit": 50}}\n</tool_call>'


@dataclass(frozen=True)
class Session:
    session_id: str
    customer: str
    turns: int


SESSIONS = (Session("sess-a1", "acme", 2), Session("sess-g1", "globex", 3), Session("sess-a2", "acme", 2))
CALLS = sum(s.turns for s in SESSIONS)

# (session, then the call) -> a context manager that attaches the session and customer the library's way
Attach = Callable[[Session], AbstractContextManager]


def run_sessions(client, attach: Attach, model: str = "tiny") -> Iterator[tuple[Session, int]]:
    """Each session's turns: user asks, the model calls get_weather, the tool answers, the user asks again."""
    for session in SESSIONS:
        with attach(session):
            messages = [{"role": "system", "content": "You are a weather agent."},
                        {"role": "user", "content": f"Weather for {session.customer}'s office?"}]
            for turn in range(session.turns):
                reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                                       max_tokens=3, temperature=0)
                message = reply.choices[0].message
                messages.append(message.model_dump(exclude_none=True, exclude={"annotations", "audio",
                                                                              "function_call", "refusal"}))
                for call in message.tool_calls or []:
                    messages.append({"role": "tool", "tool_call_id": call.id,
                                     "content": json.dumps({"temp_c": 11 + turn, "city": "Paris"})})
                messages.append({"role": "user", "content": f"And tomorrow (turn {turn + 2})?"})
                yield session, turn


def hex_id(value: str) -> str:
    """protobuf's JSON mapping writes bytes as base64; OTLP/JSON (and a collector's file exporter) writes ids as
    hex."""
    return base64.b64decode(value).hex() if value else value


def otlp_json(request_dict: dict, ids: str = "hex") -> dict:
    """An ExportTraceServiceRequest from MessageToDict, its span ids as hex (a collector) or left base64."""
    if ids == "hex":
        for rs in request_dict.get("resourceSpans", []):
            for ss in rs.get("scopeSpans", []):
                for span in ss.get("spans", []):
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if span.get(key):
                            span[key] = hex_id(span[key])
                    for link in span.get("links", []):
                        for key in ("traceId", "spanId"):
                            if link.get(key):
                                link[key] = hex_id(link[key])
    return request_dict


def write_spans(spans, out: Path, ids: str = "hex", per_line: int = 4) -> None:
    """Spans as OTLP/JSON lines, `per_line` spans to an export request (a collector batches them)."""
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    spans = list(spans)
    with out.open("w") as fh:
        for i in range(0, len(spans), per_line):
            fh.write(json.dumps(otlp_json(MessageToDict(encode_spans(spans[i:i + per_line])), ids)) + "\n")
