"""The one vocabulary of verdicts stored in the database: drift kinds, match statuses, argument diffs, and the
words stored with them (a truncated pair's `calls.detail`, how many mismatches a run's counts name).

Every view, figure, gate and report uses these words; `store/views.py` is generated from them. It lives in the
store, which owns what the database holds: `compare/` (which decides the verdicts) imports it from here, and the
store imports nothing from the wings above it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

LENGTH = "length"  # the finish reason of an answer cut at max_tokens (OpenAI's word; engines use it too)
# How each truncated pair is explained in `calls.detail`; the one-sided texts end with the other side's reason.
TRUNCATED_BOTH = f"both outputs stopped at max_tokens (finish_reason '{LENGTH}')"
TRUNCATED_ONE = "{side} output stopped at max_tokens (finish_reason '" + LENGTH + "'); {other} finished: "
# The schema error of a call to a tool its request did not offer (`compare.pairs.Analyzer.validate_call`).
NOT_OFFERED = "not a tool the request offered"
NO_TOOL_CALL = "(no tool call)"  # the per-tool key shown for calls whose recorded (or run A's) answer called none
MISMATCHES_SHOWN = 5  # mismatched pairs named in the run's counts (all are rows: calls.detail says why)


class Vocabulary(str, Enum):
    """A closed set of words stored in the database: members compare and serialise as their string values."""

    def __str__(self) -> str:
        return self.value


class DriftKind(Vocabulary):
    """The verdict for one matched call pair. Declaration order is display order (reports, views)."""

    IDENTICAL = "identical"  # same tool calls and same text
    TEXT_ONLY = "text_only"  # same tool calls, different surrounding text: recorded, not drift
    ARGUMENTS_CHANGED = "arguments_changed"
    SCHEMA_BROKEN = "schema_broken"  # valid on baseline, invalid on candidate
    TOOL_NAME_CHANGED = "tool_name_changed"
    CALL_COUNT_CHANGED = "call_count_changed"
    UNPARSEABLE = "unparseable"  # candidate (or baseline) output could not be parsed into tool calls

    @property
    def drifted(self) -> bool:
        return self not in (DriftKind.IDENTICAL, DriftKind.TEXT_ONLY)


DRIFTED_KINDS: tuple[DriftKind, ...] = tuple(k for k in DriftKind if k.drifted)
# Most severe first: a call that breaks its schema or calls another tool hurts more than a changed value.
SEVERITY: tuple[DriftKind, ...] = (DriftKind.SCHEMA_BROKEN, DriftKind.TOOL_NAME_CHANGED,
                                   DriftKind.CALL_COUNT_CHANGED, DriftKind.UNPARSEABLE,
                                   DriftKind.ARGUMENTS_CHANGED)


class MatchStatus(Vocabulary):
    """How a stored call came to be. Only `matched` pairs are compared, so only they count in drift figures
    (numerator and denominator alike): a call one side lacks, an engine failure (retried), a pair whose two sides
    answer different requests (`mismatched`: the pairing is wrong, not the candidate), and a pair where either
    side stopped at max_tokens (`truncated`: a cut answer says nothing about the candidate's decoding) are
    counted apart and shown, never as drift."""

    MATCHED = "matched"
    BASELINE_ONLY = "baseline_only"
    CANDIDATE_ONLY = "candidate_only"
    ERROR = "error"
    MISMATCHED = "mismatched"  # the two sides' request digests differ
    TRUNCATED = "truncated"  # either side's finish reason is `length` (max_tokens)

    @classmethod
    def only(cls, side: str) -> "MatchStatus":
        return cls(f"{side}_only")


class ArgDiffKind(Vocabulary):
    """How one argument differs between the two sides."""

    VALUE_CHANGED = "value_changed"
    TYPE_CHANGED = "type_changed"
    ADDED = "added"
    MISSING = "missing"


@dataclass(frozen=True)
class ArgDiff:
    """One argument that differs between baseline and candidate, addressed like `filters.status[0]`."""

    call_position: int
    tool_name: str
    path: str
    kind: ArgDiffKind
    baseline: Any = None
    candidate: Any = None


@dataclass
class CallDiff:
    """The verdict for one matched call pair."""

    kind: DriftKind
    exact_text_match: bool
    baseline_valid: bool | None
    candidate_valid: bool | None
    arg_diffs: list[ArgDiff] = field(default_factory=list)
    detail: str | None = None

    @property
    def drifted(self) -> bool:
        return DriftKind(self.kind).drifted
