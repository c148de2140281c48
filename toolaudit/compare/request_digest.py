"""Which request a call answers: a digest of what defines it, so a pair can be checked to be the same request.

A pair is only worth comparing when both sides answer the same request; a difference between answers to two
different requests is the pairing's doing, not the candidate's. The digest is the SHA-256 of the canonical JSON
(sorted keys) of:

- the messages, each reduced to its role, name, content, tool calls (name and arguments, the arguments parsed
  when they are a JSON string) and tool_call_id. Content given as text parts reads as the joined text, and an
  absent content as "". Tool-call ids are renumbered by first appearance: providers mint them at random, yet
  which result answers which call stays part of the request. Other message fields (refusal, annotations...)
  are left out: recorders echo them differently.
- the tools offered (`tools`, legacy `functions`), whole and in order: descriptions shape the answer too.
- the fields that constrain the answer: `tool_choice`, `parallel_tool_calls`, `response_format`, `function_call`.

Everything else is left out: the model (the two sides may be different deployments), the decode settings
(temperature, top_p, max_tokens, seed, stop: the decode path's, which is what a comparison is about), metadata
(sessions, customers, call indices), ids, timestamps, users and credentials. The digest is model-independent:
a replay's two paths decode the same recorded request, so their digests are equal by construction.

The tools enter the digest by their own SHA-256 (of their canonical JSON): a log repeats the same tools list on
every call, and `compare`'s scan, which already hashes each request's tools list (`scan.tools_key`), looks that
SHA-256 up instead of encoding the list again (the tools are most of a request's bytes).
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from toolaudit.compare.diff import canonical_json

SETTINGS = ("tool_choice", "parallel_tool_calls", "response_format", "function_call")
TOOL_FIELDS = ("tools", "functions")
_EXCERPT = 40  # characters of each side's message shown when they differ


def canonical_request(request: dict) -> dict[str, Any]:
    """The parts of a request the digest covers, in canonical form (see the module docstring)."""
    messages = request.get("messages")
    out: dict[str, Any] = {"messages": _messages(messages if isinstance(messages, list) else [])}
    for name in TOOL_FIELDS:
        if request.get(name):
            out[name] = request[name]
    settings = {name: request[name] for name in SETTINGS if request.get(name) is not None}
    if settings:
        out["settings"] = settings
    return out


_TOOLS_CACHE: dict[bytes, bytes] = {}  # scan.tools_key of a tools list -> tools_digest of it
_TOOLS_CACHED = 4096  # distinct tools lists remembered per process


def tools_digest(request: dict) -> bytes:
    """SHA-256 of the canonical JSON of the tools a request offers (`tools`, `functions`)."""
    return hashlib.sha256(canonical_json({name: request[name] for name in TOOL_FIELDS if request.get(name)})).digest()


def request_digest(request: dict | None, tools_key: bytes | None = None) -> bytes:
    """SHA-256 (32 bytes) of the canonical request: its messages and settings, then the SHA-256 of its tools.
    `tools_key`: a hash of the request's `tools` list the caller already has (`scan.tools_key`), under which the
    tools' SHA-256 is remembered (a request with legacy `functions` is hashed whole)."""
    request = request or {}
    canonical = canonical_request(request)
    for name in TOOL_FIELDS:
        canonical.pop(name, None)
    h = hashlib.sha256(canonical_json(canonical))
    if tools_key is None or request.get("functions"):
        h.update(tools_digest(request))
    else:
        found = _TOOLS_CACHE.get(tools_key)
        if found is None:
            if len(_TOOLS_CACHE) >= _TOOLS_CACHED:
                _TOOLS_CACHE.clear()
            found = _TOOLS_CACHE[tools_key] = tools_digest(request)
        h.update(found)
    return h.digest()


def digest_hex(request: dict | None) -> str:
    """The digest as stored in `outputs.request_digest`: 64 lowercase hex digits."""
    return request_digest(request).hex()


def describe_difference(baseline: dict | None, candidate: dict | None) -> str:
    """What differs between two requests, in a line: which parts, and where the messages part first."""
    b, c = canonical_request(baseline or {}), canonical_request(candidate or {})
    found = []
    if canonical_json(b["messages"]) != canonical_json(c["messages"]):
        found.append(_messages_difference(b["messages"], c["messages"]))
    for name in TOOL_FIELDS:
        if canonical_json(b.get(name)) != canonical_json(c.get(name)):
            found.append(_tools_difference(name, b.get(name), c.get(name)))
    b_set, c_set = b.get("settings") or {}, c.get("settings") or {}
    changed = sorted(k for k in set(b_set) | set(c_set) if canonical_json(b_set.get(k)) != canonical_json(c_set.get(k)))
    if changed:
        found.append(f"{', '.join(changed)} differ{'s' if len(changed) == 1 else ''}")
    return "; ".join(found) or "requests differ"


def _messages(messages: list) -> list:
    ids: dict[Any, int] = {}

    def renumber(value: Any) -> Any:
        if value is None:
            return None
        key = value if isinstance(value, (str, int)) else canonical_json(value)
        return ids.setdefault(key, len(ids))

    out = []
    for message in messages:
        if not isinstance(message, dict):
            out.append(message)
            continue
        item: dict[str, Any] = {"role": message.get("role"), "content": _content(message.get("content"))}
        if message.get("name") is not None:
            item["name"] = message["name"]
        calls = message.get("tool_calls")
        if isinstance(calls, list) and calls:
            item["tool_calls"] = [_tool_call(call, renumber) for call in calls]
        if message.get("function_call") is not None:
            item["function_call"] = _function(message["function_call"])
        if message.get("tool_call_id") is not None:
            item["tool_call_id"] = renumber(message["tool_call_id"])
        out.append(item)
    return out


def _content(content: Any) -> Any:
    if content is None:
        return ""
    if isinstance(content, list) and all(isinstance(p, dict) and isinstance(p.get("text"), str)
                                         and p.get("type") in (None, "text", "input_text", "output_text")
                                         for p in content):
        return "".join(p["text"] for p in content)
    return content


def _tool_call(call: Any, renumber) -> Any:
    if not isinstance(call, dict):
        return call
    out = _function(call.get("function"))
    if isinstance(out, dict):
        out["id"] = renumber(call.get("id"))
    return out


def _function(fn: Any) -> Any:
    if not isinstance(fn, dict):
        return fn
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = orjson.loads(args)
        except orjson.JSONDecodeError:
            pass  # kept as written: a broken history is part of the request
    return {"name": fn.get("name"), "arguments": args}


def _messages_difference(b: list, c: list) -> str:
    first = next((i for i in range(min(len(b), len(c))) if canonical_json(b[i]) != canonical_json(c[i])), None)
    counts = "" if len(b) == len(c) else f" (baseline {len(b)}, candidate {len(c)} messages)"
    if first is None:  # one history extends the other
        shorter = min(len(b), len(c))
        return f"messages differ after message {shorter}{counts}"
    role = b[first].get("role") if isinstance(b[first], dict) else None
    return (f"messages differ from message {first} ({role}): {_excerpt(b[first])} vs {_excerpt(c[first])}"
            f"{counts}")


def _excerpt(message: Any) -> str:
    if isinstance(message, dict):
        text = message.get("content")
        if not isinstance(text, str) or not text:
            text = canonical_json(message.get("tool_calls") or message.get("function_call") or text).decode(
                "utf-8", "replace")
    else:
        text = canonical_json(message).decode("utf-8", "replace")
    text = " ".join(text.split())
    return repr(text if len(text) <= _EXCERPT else text[:_EXCERPT - 3] + "...")


def _by_name(tools: Any) -> dict[str, bytes]:
    """Each tool's name (`?` when it has none) -> its canonical definition."""
    out: dict[str, bytes] = {}
    for tool in tools if isinstance(tools, list) else []:
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        out[name if isinstance(name, str) else "?"] = canonical_json(tool)
    return out


def _listed(label: str, names: list[str]) -> str:
    return f"{label}: {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}"


def _tools_difference(field: str, b: Any, c: Any) -> str:
    b_tools, c_tools = _by_name(b), _by_name(c)
    parts = []
    missing = [n for n in b_tools if n not in c_tools]
    added = [n for n in c_tools if n not in b_tools]
    changed = [n for n in b_tools if n in c_tools and b_tools[n] != c_tools[n]]
    if missing:
        parts.append(_listed("baseline only", missing))
    if added:
        parts.append(_listed("candidate only", added))
    if changed:
        parts.append(_listed("definitions differ", changed))
    return f"{field} differ ({'; '.join(parts) or 'same tools, in another order'})"
