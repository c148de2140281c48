"""Turn a model's answer into tool calls: OpenAI `tool_calls` fields, Hermes tags, bare JSON, Mistral markers.

Nothing here raises on model output. A broken output is a measurement (status "unparseable"), not an error:
a candidate decode path that breaks JSON is exactly the drift this tool exists to count.

Parsing uses orjson, which is strict where the stdlib is lax: it rejects NaN, Infinity and numbers that
overflow to infinity (1e400), which JSON forbids. The stdlib parser is only used after orjson failed, to
name the reason. Known orjson quirk: integers beyond 64 bits come back as floats (precision lost); checking
for that would cost more than the parse itself, so we accept it.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import orjson

from toolaudit.validate.records import ParsedOutput, ToolCall

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_MISTRAL, _MISTRAL_ARGS, _MISTRAL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
_PYTHON_TAG = "<|python_tag|>"  # Llama 3.x prefix before a JSON call
_TICKS = "```"
_TYPE_NAMES = {
    list: "array",
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


class _NonFinite(ValueError):
    pass


def _reject_constant(name: str) -> Any:
    raise _NonFinite(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _NonFinite(text)
    return value


# Stdlib decoder used only to explain an orjson failure, or to parse a JSON prefix followed by other text.
_STRICT = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)


def _loads(text: str) -> tuple[Any, str | None]:
    """Parse a whole JSON document; returns (value, error) and never raises."""
    try:
        return orjson.loads(text), None
    except orjson.JSONDecodeError as exc:
        try:
            _STRICT.decode(text)
        except _NonFinite:
            return None, "contain NaN/Infinity"
        except (ValueError, RecursionError):
            pass
        return None, f"are not valid JSON: {exc}"


def _loads_prefix(text: str) -> tuple[Any, str]:
    """JSON at the start of `text` -> (value, rest): prose may follow the JSON. Raises ValueError."""
    try:
        return orjson.loads(text), ""
    except orjson.JSONDecodeError:
        pass
    try:
        value, end = _STRICT.raw_decode(text)
    except _NonFinite as exc:
        raise ValueError("JSON contains NaN/Infinity") from exc
    except RecursionError as exc:
        raise ValueError("JSON nested too deeply") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON: {exc}") from exc
    return value, text[end:]


def _has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_has_non_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_non_finite(v) for v in value)
    return False


def parse_arguments(raw: Any) -> tuple[Any, str | None]:
    """Arguments as a JSON string or an already-parsed object -> (value, error).

    On error the value is what we could get (the raw string, or the parsed non-object) so a diff still has
    something to compare. An empty string or None means `{}`: OpenAI sends "" for some no-argument calls,
    and a missing argument list is not a malformed one.
    """
    if raw is None:
        return {}, None
    if isinstance(raw, (bytes, bytearray)):
        raw = bytes(raw).decode("utf-8", "replace")
    if isinstance(raw, str):
        if not raw or raw.isspace():
            return {}, None
        value, error = _loads(raw)
        if error is not None:
            return raw, f"arguments {error}"
    else:
        value = raw
        try:  # objects may come from a lax JSON parser (the stdlib's accepts NaN)
            if isinstance(value, dict) and _has_non_finite(value):
                return value, "arguments contain NaN/Infinity"
        except RecursionError:
            return value, "arguments are nested too deeply"
    if not isinstance(value, dict):
        kind = _TYPE_NAMES.get(type(value), type(value).__name__)
        return value, f"arguments must be a JSON object, got {kind}"
    return value, None


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
        return "".join(_part_text(p) for p in content)
    return ""


def _part_text(part: Any) -> str:
    if isinstance(part, dict):
        text = part.get("text")
        return text if isinstance(text, str) else ""
    return part if isinstance(part, str) else ""


def _unparseable(text: str, fmt: str, error: str) -> ParsedOutput:
    return ParsedOutput(status="unparseable", format=fmt, text=text, error=error)


def _openai_call(entry: Any, index: int) -> ToolCall | str:
    """One OpenAI tool-call entry (Chat Completions, or a flat Responses `function_call`) -> call or error."""
    if not isinstance(entry, dict):
        return f"tool_calls[{index}] is not an object"
    fn = entry.get("function")
    if fn is None and "name" in entry:  # Responses API / legacy function_call shape
        fn = entry
    if not isinstance(fn, dict):
        return f"tool_calls[{index}] has no function object"
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        return f"tool_calls[{index}] has no string name"
    raw = fn.get("arguments")
    value, error = parse_arguments(raw)
    call_id = entry.get("id", entry.get("call_id"))
    return ToolCall(
        name,
        value,
        call_id if isinstance(call_id, str) else None,
        error,
        raw if isinstance(raw, str) else None,
    )


def parse_message(message: Any) -> ParsedOutput:
    """An OpenAI Chat Completions assistant message -> ParsedOutput; without tool_calls, parse the content."""
    if not isinstance(message, dict):
        return _unparseable("", "none", f"message is not an object (got {type(message).__name__})")
    try:
        return _parse_message(message)
    except Exception as exc:  # noqa: BLE001 -- the contract is "never raise on model output"; this is the last line of defence
        return _unparseable(_content_text(message.get("content")), "none", f"parser failure: {exc!r}")


def _parse_message(message: dict) -> ParsedOutput:
    text = _content_text(message.get("content"))
    entries = message.get("tool_calls")
    if entries is None and isinstance(message.get("function_call"), dict):  # pre-2023 single-call field
        entries = [message["function_call"]]
    if isinstance(entries, list):
        if not entries:
            return parse_text(text)
        calls = []
        for i, entry in enumerate(entries):
            call = _openai_call(entry, i)
            if isinstance(call, str):
                return _unparseable(text, "openai", call)
            calls.append(call)
        return ParsedOutput(status="ok", calls=tuple(calls), format="openai", text=text)
    if entries is not None:
        return _unparseable(text, "openai", f"tool_calls is not a list (got {type(entries).__name__})")
    return parse_text(text)


def _call_from_obj(obj: Any, need_args: bool) -> ToolCall | str:
    """A decoded JSON call object -> ToolCall, or an error string. `need_args`: a bare JSON object only
    counts as a call with an arguments/parameters key; inside a tag or marker, the tag is the signal and {}
    is implied."""
    if not isinstance(obj, dict):
        return f"call is a JSON {_TYPE_NAMES.get(type(obj), type(obj).__name__)}, not an object"
    if isinstance(obj.get("function"), dict) and "name" not in obj:  # an OpenAI-shaped call written as text
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return "call has no string 'name'"
    key = "arguments" if "arguments" in obj else "parameters" if "parameters" in obj else None
    if key is None and need_args:
        return "call has no 'arguments' or 'parameters'"
    raw = obj.get(key) if key else None
    value, error = parse_arguments(raw)
    call_id = obj.get("id")
    return ToolCall(
        name,
        value,
        call_id if isinstance(call_id, str) else None,
        error,
        raw if isinstance(raw, str) else None,
    )


def _calls_from_json(value: Any, need_args: bool) -> list[ToolCall] | str:
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        call = _call_from_obj(item, need_args)
        if isinstance(call, str):
            return call
        calls.append(call)
    return calls


def _join(*parts: str) -> str:
    return "\n".join(p for p in (s.strip() for s in parts) if p)


def _parse_hermes(text: str) -> ParsedOutput:
    """`<tool_call>{json}</tool_call>` blocks; the last may lack its closing tag (generation stopped there).
    A closing tag without an opening one means `<tool_call>` was prefilled in the prompt: treat it as open."""
    if _OPEN not in text:
        text = _OPEN + text
    outside, calls, pos = [], [], 0
    while True:
        start = text.find(_OPEN, pos)
        if start < 0:
            outside.append(text[pos:])
            break
        outside.append(text[pos:start])
        body_start = start + len(_OPEN)
        end = text.find(_CLOSE, body_start)
        body = text[body_start:] if end < 0 else text[body_start:end]
        pos = len(text) if end < 0 else end + len(_CLOSE)
        try:
            value, rest = _loads_prefix(body.strip())
        except ValueError as exc:
            return _unparseable(text, "hermes", f"tool call {len(calls)}: {exc}")
        found = _calls_from_json(value, need_args=False)
        if isinstance(found, str):
            return _unparseable(text, "hermes", f"tool call {len(calls)}: {found}")
        calls.extend(found)
        outside.append(rest)
    if not calls:
        return _unparseable(text, "hermes", "empty <tool_call> block")
    return ParsedOutput(status="ok", calls=tuple(calls), format="hermes", text=_join(*outside))


def _parse_mistral(text: str) -> ParsedOutput:
    """`[TOOL_CALLS] [{...}, ...]` (older tokenizers) or `[TOOL_CALLS]name[ARGS]{...}` repeated (v11+)."""
    before, _, after = text.partition(_MISTRAL)
    calls: list[ToolCall] = []
    outside = [before]
    for segment in after.split(_MISTRAL):
        segment = segment.strip()
        try:
            if _MISTRAL_ARGS in segment:
                head, _, args = segment.partition(_MISTRAL_ARGS)
                name, _, call_id = head.partition(_MISTRAL_ID)
                value, rest = _loads_prefix(args.strip())
                obj = {"name": name.strip(), "arguments": value}
                if call_id.strip():
                    obj["id"] = call_id.strip()
            else:
                obj, rest = _loads_prefix(segment)
        except ValueError as exc:
            return _unparseable(text, "mistral", f"tool call {len(calls)}: {exc}")
        found = _calls_from_json(obj, need_args=False)
        if isinstance(found, str):
            return _unparseable(text, "mistral", f"tool call {len(calls)}: {found}")
        calls.extend(found)
        outside.append(rest)
    if not calls:
        return _unparseable(text, "mistral", "[TOOL_CALLS] with no calls")
    return ParsedOutput(status="ok", calls=tuple(calls), format="mistral", text=_join(*outside))


def _parse_json(text: str, before: str = "", after: str = "") -> ParsedOutput:
    """A bare JSON call, or an array of them. An empty array is an explicit "no call"."""
    try:
        value, rest = _loads_prefix(text)
    except ValueError as exc:
        return _unparseable(text, "json", str(exc))
    if value == []:
        return ParsedOutput(status="no_tool_call", format="json", text=_join(before, rest, after))
    found = _calls_from_json(value, need_args=True)
    if isinstance(found, str):
        return _unparseable(text, "json", f"JSON is not a tool call: {found}")
    return ParsedOutput(status="ok", calls=tuple(found), format="json", text=_join(before, rest, after))


def parse_text(text: Any) -> ParsedOutput:
    """Raw model text -> ParsedOutput. Formats: hermes tags, Mistral `[TOOL_CALLS]`, bare or fenced JSON.

    When the output is unparseable, `text` is the raw text unchanged, so two broken outputs can be compared.
    """
    if text is None:
        return ParsedOutput(status="no_tool_call")
    if not isinstance(text, str):
        return _unparseable("", "none", f"text is not a string (got {type(text).__name__})")
    try:
        parsed = _parse_text(text)
    except Exception as exc:  # noqa: BLE001 -- last line of defence, see parse_message
        parsed = _unparseable(text, "none", f"parser failure: {exc!r}")
    if parsed.status == "unparseable" and parsed.text is not text:
        parsed = replace(parsed, text=text)
    return parsed


def _parse_text(text: str) -> ParsedOutput:
    if _OPEN in text or _CLOSE in text:
        return _parse_hermes(text)
    if _MISTRAL in text:
        return _parse_mistral(text)
    stripped = text.strip()
    if stripped.startswith(_PYTHON_TAG):
        stripped = stripped[len(_PYTHON_TAG) :].lstrip()
    if stripped[:1] in ("{", "["):
        return _parse_json(stripped)
    fence = _find_fence(stripped)
    if fence is not None:
        start, end, body = fence
        body = body.strip()
        before, after = stripped[:start], stripped[end:]
        if stripped.startswith("```"):
            return _parse_json(body, before, after)
        # A fence in the middle of prose is a call only if it parses as one; otherwise it is just prose.
        if body[:1] in ("{", "["):
            parsed = _parse_json(body, before, after)
            if parsed.status == "ok":
                return parsed
    return ParsedOutput(status="no_tool_call", text=stripped)


def _find_fence(text: str) -> tuple[int, int, str] | None:
    """The first ```json ... ``` block: (start, end, body), in linear time. (The regular expression
    "```(?:json)?[ \\t]*\\r?\\n?(.*?)```" means the same, but backtracks quadratically over a long run of
    spaces after an unclosed fence: model output must never be able to stall a run.)"""
    start = text.find(_TICKS)
    if start < 0:
        return None
    i = start + len(_TICKS)
    if text.startswith(("json", "JSON"), i):
        i += 4
    while i < len(text) and text[i] in " \t":
        i += 1
    if text.startswith("\r", i):
        i += 1
    if text.startswith("\n", i):
        i += 1
    end = text.find(_TICKS, i)
    # no closing fence after this opening one: none after any later opening either (they would close this one)
    return None if end < 0 else (start, end + len(_TICKS), text[i:end])
