"""Typed records that cross module boundaries: tool calls, parsed outputs, argument diffs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

ParseStatus = Literal["ok", "no_tool_call", "unparseable"]

DRIFT_KINDS = (
    "identical",  # same tool calls and same text
    "text_only",  # same tool calls, different surrounding text
    "arguments_changed",
    "tool_name_changed",
    "call_count_changed",
    "unparseable",  # candidate (or baseline) output could not be parsed into tool calls
    "schema_broken",  # valid on baseline, invalid on candidate
)
DRIFTED_KINDS = frozenset(DRIFT_KINDS) - {"identical", "text_only"}

ARG_DIFF_KINDS = ("value_changed", "type_changed", "added", "missing")


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


@dataclass(frozen=True)
class ArgDiff:
    """One argument that differs between baseline and candidate, addressed like `filters.status[0]`."""

    call_position: int
    tool_name: str
    path: str
    kind: str  # one of ARG_DIFF_KINDS
    baseline: Any = None
    candidate: Any = None


@dataclass
class CallDiff:
    """The verdict for one matched call pair."""

    kind: str  # one of DRIFT_KINDS
    exact_text_match: bool
    baseline_valid: bool | None
    candidate_valid: bool | None
    arg_diffs: list[ArgDiff] = field(default_factory=list)
    detail: str | None = None

    @property
    def drifted(self) -> bool:
        return self.kind in DRIFTED_KINDS
