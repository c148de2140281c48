"""What parsing a model's answer yields: tool calls as the model emitted them, or why there are none."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

ParseStatus = Literal["ok", "no_tool_call", "unparseable"]


@dataclass(frozen=True)
class ToolCall:
    """One function call as the model emitted it. `arguments` is parsed JSON (normally a dict)."""

    name: str
    arguments: Any
    id: str | None = None
    # Set when the arguments could not be used as an object: not JSON, JSON but not an object, NaN...
    arguments_error: str | None = None
    raw_arguments: str | None = None


@dataclass(frozen=True)
class ParsedOutput:
    """What a model's answer turned into: tool calls, plain text, or an unparseable attempt."""

    status: ParseStatus
    calls: tuple[ToolCall, ...] = ()
    format: str = "none"  # openai | hermes | json | mistral | none
    text: str = ""  # the assistant text (content) outside tool calls, or the raw text when unparseable
    error: str | None = None
