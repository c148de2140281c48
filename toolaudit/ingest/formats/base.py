"""What every whole-file reader produces, and the helpers the built-in readers share (a plug-in may use them).

A reader turns a file into a `Conversion`: calls in the OpenAI Chat Completions shape (`Call`: session,
customer, request, response, and the `Origin` that names the original line, span or observation id and the
attribute that holds the answer), problems naming the original line and record (`Problem`), and a count of the
records skipped, with a reason each. toolaudit turns these into the records every format yields
(`toolaudit.ingest.held`): it checks each call as it checks a line of an OpenAI log, orders a span format's calls
by start time and gives every error row the original file, line, record id and field.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from toolaudit.ingest import deepjson
from toolaudit.ingest.records import DEFAULT_CUSTOMER_KEY, DEFAULT_SESSION_KEY, EXCERPT_CHARS, KNOWN_ROLES


@dataclass(frozen=True)
class Keys:
    """Where the session and customer come from: a dotted path (OpenAI, Responses), an attribute name (OTel,
    OpenInference: span first, then resource) or an observation/trace field (Langfuse). None: the format's
    default."""

    session: str | None = None
    customer: str | None = None
    # A call without a session is kept with session "" rather than made an error row (OpenAI logs): `compare`
    # can pair such calls by request (compare.pairing), and turns them into error rows when it pairs by session.
    sessionless: bool = False

    @classmethod
    def from_options(cls, session_key: str | None, customer_key: str | None, sessionless: bool = False) -> Keys:
        return cls(None if session_key in (None, "", DEFAULT_SESSION_KEY) else session_key,
                   None if customer_key in (None, "", DEFAULT_CUSTOMER_KEY) else customer_key, sessionless)


@dataclass(frozen=True)
class Origin:
    """Where a call came from: the original file's line, the span or observation id, and the attribute that
    holds the recorded answer (named when that answer is missing)."""

    line: int
    record: str | None = None
    response_field: str | None = None


@dataclass(frozen=True)
class Problem:
    """A record that could not be used: becomes one `trace_errors` row."""

    line: int
    record: str | None
    field: str | None
    message: str
    excerpt: str


@dataclass
class Call:
    session_id: str
    customer: str | None
    request: dict
    response: dict | None
    origin: Origin
    order: tuple = ()  # sort key inside the session (start time, line, position); () keeps file order
    call_index: str | None = None  # an explicit index (line formats); None: assigned from `order`


class Invalid(Exception):
    """Raised inside a reader for the first problem of a record: (field, message)."""

    def __init__(self, field: str | None, message: str):
        super().__init__(message)
        self.field, self.message = field, message


@dataclass
class Conversion:
    """Everything a reader found in one file; every record is a call, a problem or a skip."""

    fmt: str
    lines: int = 0
    blank: int = 0
    records: int = 0
    calls: list[Call] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)
    by_session: bool = False  # span formats: a session's calls are ordered by `order`, indices assigned

    def problem(self, line: int, record: str | None, field_name: str | None, message: str, raw: Any = b"") -> None:
        self.problems.append(Problem(line, record, field_name, message, excerpt(raw)))

    def skip(self, reason: str) -> None:
        self.skipped[reason] += 1

    def ordered(self) -> list[Call]:
        """Calls in writing order, with call indices assigned for span formats."""
        if not self.by_session:
            return list(self.calls)
        sessions: dict[str, list[Call]] = {}
        for call in self.calls:
            sessions.setdefault(call.session_id, []).append(call)
        out: list[Call] = []
        firsts = sorted(sessions.values(), key=lambda calls: min((c.origin.line, c.order) for c in calls))
        for calls in firsts:
            calls.sort(key=lambda c: c.order)
            for index, call in enumerate(calls):
                call.call_index = str(index)
                out.append(call)
        return out


def excerpt(raw: Any) -> str:
    if isinstance(raw, (bytes, bytearray)):
        data = bytes(raw[: EXCERPT_CHARS * 4])
    elif isinstance(raw, str):
        return raw[:EXCERPT_CHARS].rstrip()
    else:
        try:
            data = orjson.dumps(raw)[: EXCERPT_CHARS * 4]
        except TypeError:
            return repr(raw)[:EXCERPT_CHARS]
    return data.decode("utf-8", errors="replace")[:EXCERPT_CHARS].rstrip()


def canonical_bytes(value: Any) -> bytes:
    """Sorted-key JSON of a record, for telling an identical duplicate from a conflicting one."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # nested past orjson's 254 levels
        return deepjson.dumps(value).encode()


def record_lines(path: str, conv: "Conversion") -> Iterator[tuple[int, bytes]]:
    """The non-blank lines of a file with their line numbers; every line and blank is counted in `conv`."""
    with open(path, "rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            conv.lines += 1
            if not raw.strip():
                conv.blank += 1
                continue
            yield line_no, raw


BOM = b"\xef\xbb\xbf"


def without_bom(raw: bytes) -> bytes:
    """The line without a leading UTF-8 byte order mark: Windows editors and PowerShell's `Out-File` put one at
    the start of a file, and orjson (rightly, for JSON text) refuses it. Stripped wherever a line is parsed, so a
    line read again by its byte offset parses the same."""
    return raw[3:] if raw[:3] == BOM else raw


GZIP_MAGIC = b"\x1f\x8b"


def not_utf8(raw: bytes, at: int) -> str:
    """Why a line is not text: a gzip stream said as such (an export saved compressed), else the first bad byte."""
    if raw[:2] == GZIP_MAGIC:
        return f"invalid UTF-8 at byte {at}: this is gzip-compressed data; decompress the file first (gunzip)"
    return f"invalid UTF-8 at byte {at}"


def load_line(raw: bytes) -> tuple[Any, str | None]:
    """(value, None) or (None, why it is not JSON). orjson only: deep nesting is an error, not a crash."""
    raw = without_bom(raw)
    try:
        return orjson.loads(raw), None
    except orjson.JSONDecodeError as exc:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as uexc:
            return None, not_utf8(raw, uexc.start)
        return None, f"not valid JSON: {exc}"


def json_value(value: Any, field_name: str) -> Any:
    """An attribute that holds JSON: a string is parsed (Invalid when it is not JSON), structure passes."""
    if isinstance(value, str):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise Invalid(field_name, f"not valid JSON: {exc}") from None
    return value


def arguments_text(value: Any) -> str:
    """Tool-call arguments as the string a Chat Completions log records: strings are kept byte for byte."""
    if value is None:
        return "{}"
    if isinstance(value, str):
        return value
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return str(value)


def text_content(texts: list[str]) -> Any:
    """A message's text parts as Chat content: None without any, a string for one, parts for several."""
    if not texts:
        return None
    if len(texts) == 1:
        return texts[0]
    return [{"type": "text", "text": t} for t in texts]


def chat_tools(tools: Any, field_name: str) -> list:
    """Tool definitions, flat ({type, name, parameters}) or nested ({type, function}), as Chat tools."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise Invalid(field_name, f"must be a list of tool definitions, got {type(tools).__name__}")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise Invalid(f"{field_name}[{i}]", f"must be an object, got {type(tool).__name__}")
        if isinstance(tool.get("function"), dict):
            out.append({"type": "function", "function": tool["function"]})
        elif tool.get("type", "function") == "function":
            if not isinstance(tool.get("name"), str) or not tool["name"]:
                raise Invalid(f"{field_name}[{i}].name", "missing: a tool definition needs a name")
            fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
            out.append({"type": "function", "function": fn})
        # other tool types (web search, file search, MCP...) cannot be called as functions: left out
    return out


def tools_from_json(text: str, field_name: str, single: bool = False) -> list:
    """Tool definitions held in a JSON string (a list, or one tool with `single`), as Chat tools.

    Agents send the same definitions with every call: calls whose strings are equal share the converted tool
    objects (parsed once, held in memory once), so a request's tools are read, never changed."""
    try:
        return list(_shared_tools(text, single))
    except Invalid:  # convert again to name the field
        return chat_tools([json_value(text, field_name)] if single else json_value(text, field_name), field_name)


@functools.lru_cache(maxsize=1024)
def _shared_tools(text: str, single: bool) -> tuple:
    return tuple(chat_tools([json_value(text, "")] if single else json_value(text, ""), ""))


def chat_response(message: dict, finish_reason: str | None, response_id: Any = None, model: Any = None,
                  created: Any = None, usage: dict | None = None, fingerprint: Any = None) -> dict:
    """A ChatCompletion around one assistant message. A finish reason the record does not give stays None (not
    made up: "length" is what tells a cut answer, `compare.attribution`)."""
    response: dict[str, Any] = {"object": "chat.completion"}
    if response_id is not None:
        response["id"] = str(response_id)
    if created is not None:
        response["created"] = created
    if model is not None:
        response["model"] = model
    response["choices"] = [{"index": 0, "message": message, "finish_reason": finish_reason}]
    if usage:
        response["usage"] = usage
    if fingerprint is not None:
        response["system_fingerprint"] = fingerprint
    return response


def usage_block(prompt: Any, completion: Any) -> dict | None:
    prompt, completion = as_int(prompt), as_int(completion)
    if prompt is None and completion is None:
        return None
    out = {"prompt_tokens": prompt or 0, "completion_tokens": completion or 0}
    out["total_tokens"] = out["prompt_tokens"] + out["completion_tokens"]
    return out


def as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return None


def as_key(value: Any) -> str | None:
    """A session or customer id: a non-empty string, or an integer written as one."""
    if isinstance(value, str) and value:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def get_dotted(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def check_role(role: Any, field_name: str) -> str:
    if role not in KNOWN_ROLES:
        raise Invalid(field_name, f"unknown role {role!r} (expected one of {sorted(KNOWN_ROLES)})")
    return role
