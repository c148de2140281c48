"""Never a silent nothing, call by call: what the calls read from a file leave out, counted and said.

A file can be read "successfully" and still be useless for an audit: spans recorded with message content
capture off carry no messages (nothing to replay), the official OpenTelemetry instrumentation records no tool
definitions (nothing to validate arguments against), and a session or customer key that matches nothing puts
every call in its own session (nothing pairs up between two recordings) or under "no customer" (no
per-customer report). `import`, `compare` and `replay` count these per file (`CallGaps`) and print a warning
for each (`gap_warnings`), naming the keys the file does hold (`present_keys`) when a key matched nothing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

from toolaudit.ingest.records import DEFAULT_CUSTOMER_KEY, DEFAULT_SESSION_KEY

SHOWN_KEYS = 8  # keys named in a warning
SAMPLED_LINES = 200  # lines read to find the keys a file holds
_ID_WORDS = re.compile(r"session|conversation|thread|user|customer|tenant|org|account|client|team|project")


@dataclass
class CallGaps:
    """What the calls of one file lack, and how many distinct sessions they fall in (for "every call is its own
    session"). `import` and `replay` count call by call (`add`); `compare` counts in SQL over its staged digests."""

    calls: int = 0
    no_content: int = 0  # no message carries text, parts or tool calls
    no_tools: int = 0  # the request offers no tool definitions (no schema to validate against)
    no_customer: int = 0
    sessions: int = 0
    _seen: set[str] = field(default_factory=set, repr=False, compare=False)

    def add(self, session_id: str, customer: str | None, request: dict) -> None:
        self.calls += 1
        self.no_content += not has_content(request)
        self.no_tools += not has_tools(request)
        self.no_customer += customer is None
        if session_id not in self._seen:
            self._seen.add(session_id)
            self.sessions += 1


def has_content(request: dict) -> bool:
    """Whether any message of the request says something: text, content parts or tool calls."""
    messages = request.get("messages") if isinstance(request, dict) else None
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, dict):
            continue
        if message.get("tool_calls") or message.get("function_call"):
            return True
        content = message.get("content")
        if isinstance(content, str) and content.strip():
            return True
        if isinstance(content, list) and content:
            return True
    return False


def has_tools(request: dict) -> bool:
    tools = request.get("tools") if isinstance(request, dict) else None
    functions = request.get("functions") if isinstance(request, dict) else None
    return bool(tools) or bool(functions)


def gap_warnings(gaps: CallGaps, path: str | Path, session_key: str | None, customer_key: str | None) -> list[str]:
    """One line per gap, each with what to do about it."""
    out: list[str] = []
    if not gaps.calls:
        return out
    n = gaps.calls
    hint = _KeysHint(path)
    if gaps.no_content:
        out.append(f"{path}: {gaps.no_content} of {n} calls hold no message content: nothing to replay (was message "
                   f"content capture switched on? e.g. OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true)")
    if gaps.no_tools:
        out.append(f"{path}: {gaps.no_tools} of {n} calls offer no tool definitions: their arguments are diffed but "
                   f"not validated against a schema (the official OpenTelemetry instrumentation records none; "
                   f"--schemas DIR supplies <tool>.json schemas)")
    if n >= 2 and gaps.sessions == n:
        key = _said(session_key, DEFAULT_SESSION_KEY, "gen_ai.conversation.id or session.id")
        out.append(f"{path}: every call is its own session ({n} calls): no record carries a session at {key}, so "
                   f"calls cannot pair up by session and call index; use --session-key."
                   + hint.text())
    if gaps.no_customer == n:
        key = _said(customer_key, DEFAULT_CUSTOMER_KEY, "user.id")
        out.append(f"{path}: no record carries a customer at {key}: every call is under \"no customer\"; use "
                   f"--customer-key." + hint.text())
    return out


def _said(key: str | None, default: str, span_default: str) -> str:
    if key in (None, "", default):
        return f"the default key ({default} in line logs, {span_default} on spans)"
    return repr(key)


class _KeysHint:
    """The keys the file holds, read once however many warnings name them."""

    def __init__(self, path: str | Path):
        self.path, self.keys = path, None

    def text(self) -> str:
        if self.keys is None:
            self.keys = present_keys(self.path)
        return f" Keys in the file that may hold it: {', '.join(self.keys)}." if self.keys else ""


def present_keys(path: str | Path, limit: int = SAMPLED_LINES) -> list[str]:
    """Dotted keys holding short strings in the file's first records, those that look like ids first
    (session, user, customer, tenant...). OTLP attribute lists count as objects, and attributes holding a JSON
    object as the object (`metadata.customer` inside OpenInference's JSON-string `metadata`)."""
    seen: dict[str, int] = {}
    try:
        with open(path, "rb") as handle:
            for raw in islice((line for line in handle if line.strip()), limit):
                try:
                    record = json.loads(raw)
                except ValueError:
                    continue
                _walk(record, "", seen, 0)
    except OSError:
        return []
    ranked = sorted(seen, key=lambda k: (not _ID_WORDS.search(k), -seen[k], k))
    return [k for k in ranked if _ID_WORDS.search(k)][:SHOWN_KEYS]


def _walk(value: Any, prefix: str, seen: dict[str, int], depth: int) -> None:
    if depth > 12:
        return
    if isinstance(value, list):
        if value and all(isinstance(v, dict) and isinstance(v.get("key"), str) and "value" in v for v in value):
            for item in value:  # OTLP attributes: [{"key": k, "value": {"stringValue": ...}}], named by key alone
                inner = item["value"]
                if isinstance(inner, dict) and len(inner) == 1:
                    inner = next(iter(inner.values()))
                _walk(inner, f"{item['key']}.", seen, depth + 1)
            return
        for item in value[:50]:
            _walk(item, prefix, seen, depth + 1)
        return
    if isinstance(value, dict):
        for key, inner in value.items():
            if key in ("messages", "content", "input", "output", "tools", "choices"):
                continue
            _walk(inner, f"{prefix}{key}.", seen, depth + 1)
        return
    if isinstance(value, str) and value[:1] == "{" and len(value) < 4096:
        try:
            inner = json.loads(value)
        except ValueError:
            inner = None
        if isinstance(inner, dict):
            _walk(inner, prefix, seen, depth + 1)
            return
    if isinstance(value, (str, int)) and not isinstance(value, bool) and len(str(value)) <= 200:
        key = prefix[:-1]
        if key:
            seen[key] = seen.get(key, 0) + 1
