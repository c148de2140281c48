"""One line of an OpenAI Chat Completions log, `{"request": <chat.completions.create body>, "response":
<ChatCompletion>}`, checked and turned into a `RawCall`, or into a `TraceLineError` naming the line and field.

The same checks apply to the calls of every other format (`check_request`, `as_key`, `as_index`), so that a call
is usable or not whatever file it came from.
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any

import orjson

from toolaudit.ingest.formats.base import as_key, not_utf8, without_bom
from toolaudit.ingest.records import (
    CALL_INDEX_KEY,
    KNOWN_ROLES,
    RawCall,
    TraceLineError,
    get_dotted,
    line_error,
)
from toolaudit.ingest.registry import mixed

_CALL_INDEX_PARTS = tuple(CALL_INDEX_KEY.split("."))
NO_RESPONSE = "missing: comparing recorded logs needs the recorded response"


@functools.lru_cache(maxsize=64)
def _split(dotted: str) -> tuple[str, ...]:
    return tuple(dotted.split("."))


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def json_error(raw: bytes, refused: str = "") -> tuple[str | None, str]:
    """Explain why orjson refused a line (`refused`: its message), in the words a user can act on."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, not_utf8(raw, exc.start)
    try:
        json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:
        return None, "not valid JSON: nested too deeply"
    except ValueError as exc:
        if "is not valid JSON" in str(exc):
            return None, f"{exc} (NaN/Infinity are not allowed)"
        return None, f"not valid JSON: {exc}"
    # Python's parser takes what orjson refuses: a lone surrogate escape, a number past a double (1e400)
    return None, f"not valid JSON: {refused}" if refused else "not valid JSON"


def check_request(request: Any) -> tuple[str, str] | None:
    """Return (field, message) for the first structural problem of a request, or None."""
    if not isinstance(request, dict):
        return "request", f"must be an object, got {type(request).__name__}"
    messages = request.get("messages")
    if not isinstance(messages, list):
        got = "missing" if messages is None else f"a {type(messages).__name__}"
        return "request.messages", f"must be a list, got {got}"
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            return f"request.messages[{i}]", f"must be an object, got {type(message).__name__}"
        role = message.get("role")
        if role not in KNOWN_ROLES:
            return f"request.messages[{i}].role", f"unknown role {role!r} (expected one of {sorted(KNOWN_ROLES)})"
    tools = request.get("tools")
    if tools is not None and not isinstance(tools, list):
        return "request.tools", f"must be a list, got {type(tools).__name__}"
    return None


MAX_INDEX = 2**31 - 1  # call indices are stored as INTEGER


def as_index(value: Any) -> int | None:
    """A call index: a non-negative integer that fits the stored INTEGER column (a number or digits), else None."""
    if isinstance(value, bool):
        return None
    index = None
    if isinstance(value, int):
        index = value
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        index = int(value)
    elif isinstance(value, str) and value.strip().isdigit():
        index = int(value.strip())
    return index if index is not None and 0 <= index <= MAX_INDEX else None


def _hint(record: Any) -> str:
    return mixed(record, "openai")


NO_SESSION = ("missing or not a string: cannot tell which session this call belongs to (use --session-key to "
              "name another field)")


def parse_line(raw: bytes, source: str, line_no: int, session_key: str, customer_key: str,
               require_response: bool, key: int = 0, sessionless: bool = False) -> RawCall | TraceLineError:
    """Everything about one line that does not depend on other lines. `key`: the line's byte offset.
    `sessionless`: a line without a session is a call of session "" (compare pairs it by request)."""
    raw = without_bom(raw)
    try:
        record = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return line_error(raw, source, line_no, *json_error(raw, str(exc)))
    if not isinstance(record, dict):
        return line_error(raw, source, line_no, None, f"line must be a JSON object, got {type(record).__name__}")
    if "request" not in record:
        return line_error(raw, source, line_no, "request",
                          "missing (each line is {\"request\": ..., \"response\": ...})" + _hint(record))
    problem = check_request(record["request"])
    if problem:
        return line_error(raw, source, line_no, problem[0], problem[1] + _hint(record))
    request = record["request"]
    response = record.get("response")
    if response is not None and not isinstance(response, dict):
        return line_error(raw, source, line_no, "response", f"must be an object, got {type(response).__name__}")
    if require_response and response is None:
        return line_error(raw, source, line_no, "response", NO_RESPONSE)

    session_id = as_key(get_dotted(record, _split(session_key)))
    if session_id is None:
        if not sessionless:
            return line_error(raw, source, line_no, session_key, NO_SESSION)
        session_id = ""
    customer = as_key(get_dotted(record, _split(customer_key)))
    explicit = get_dotted(record, _CALL_INDEX_PARTS)
    index = None
    if explicit is not None:
        index = as_index(explicit)
        if index is None:
            return line_error(raw, source, line_no, CALL_INDEX_KEY,
                              f"must be an integer from 0 to 2147483647, got {explicit!r}")
    return RawCall(line_no, session_id, index, customer, request, response, key)
