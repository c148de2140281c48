"""A sample's outcome: what the distribution test of a sampled replay compares.

At temperature > 0 one answer per call says nothing about a decode path; the distribution of its answers does.
Each sample is reduced to one label: its canonical tool-call signature (tool names and canonical arguments, so
key order and whitespace never separate two samples, as in greedy drift) or a word for why it has none. The
labels are what `compare.distributions` tests; the first call's tool and arguments are kept for the
per-argument value shares.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from toolaudit.compare.diff import call_signature
from toolaudit.validate.records import ParsedOutput, ToolCall


class OutcomeKind(str, Enum):
    TOOL_CALL = "tool_call"
    NO_TOOL_CALL = "no_tool_call"
    UNPARSEABLE = "unparseable"
    SCHEMA_INVALID = "schema_invalid"
    TRUNCATED = "truncated"  # cut at max_tokens: the path's limit, not its distribution (left out of tests)
    ERROR = "error"  # the engine failed this sample (left out of tests)

    @property
    def tested(self) -> bool:
        """Whether samples of this kind enter the distribution test."""
        return self not in (OutcomeKind.TRUNCATED, OutcomeKind.ERROR)


@dataclass(frozen=True)
class SampleOutcome:
    outcome: str  # the label the test compares
    kind: OutcomeKind
    tool_name: str | None = None
    arguments: Any = None  # the first call's arguments (parsed JSON), None when unparsed


def signature_label(calls: tuple[ToolCall, ...]) -> str:
    """`name{canonical arguments}` per call, in order, joined by `; `: equal for calls diff would call equal."""
    parts = []
    for call in calls:
        name, args = call_signature(call)
        parts.append(f"{name}{args.decode('utf-8', 'replace')}")
    return "; ".join(parts)


def sample_outcome(parsed: ParsedOutput, finish_reason: str | None, error: str | None,
                   validate: Callable[[ToolCall], bool | None],
                   not_offered: Callable[[ToolCall], bool] = lambda call: False) -> SampleOutcome:
    """The outcome of one sample. `validate(call)` is True/False where a schema judges the call, None where none
    can (then the call counts as valid: an unknown schema is not an invalid answer). A call to a tool the request
    did not offer (`not_offered`) makes the sample schema-invalid but keeps its signature as the label: which name
    a path invents is part of its distribution (one `schema_invalid` label for all of them would hide a sampler
    that changes them)."""
    if error is not None:
        return SampleOutcome(OutcomeKind.ERROR.value, OutcomeKind.ERROR)
    first = parsed.calls[0] if parsed.calls else None
    name = first.name if first else None
    args = first.arguments if first is not None and first.arguments_error is None else None
    if finish_reason == "length":
        return SampleOutcome(OutcomeKind.TRUNCATED.value, OutcomeKind.TRUNCATED, name, args)
    if parsed.status == "unparseable" or any(c.arguments_error is not None for c in parsed.calls):
        return SampleOutcome(OutcomeKind.UNPARSEABLE.value, OutcomeKind.UNPARSEABLE, name, args)
    if not parsed.calls:
        return SampleOutcome(OutcomeKind.NO_TOOL_CALL.value, OutcomeKind.NO_TOOL_CALL)
    invented = [not_offered(c) for c in parsed.calls]
    if any(validate(c) is False for c, x in zip(parsed.calls, invented) if not x):
        return SampleOutcome(OutcomeKind.SCHEMA_INVALID.value, OutcomeKind.SCHEMA_INVALID, name, args)
    kind = OutcomeKind.SCHEMA_INVALID if any(invented) else OutcomeKind.TOOL_CALL
    return SampleOutcome(signature_label(parsed.calls), kind, name, args)
