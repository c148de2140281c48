"""The `calls`, `outputs` and `arg_diffs` rows a call pair produces in Python: a matched pair's verdict, an
engine failure. Rows are built by column name (never positional tuples) into a `RowBuffer`, so `compare` (two
recorded logs), `replay` (live decode paths) and `batch import` produce the same columns and a column added to
the store cannot shift others; the store writes the buffer (for `compare`, `store.staging` writes these rows
and the agreeing pairs' rows that it computes in SQL).

`Analyzer` holds the per-run caches (compiled schemas per tools list) and turns one call pair into rows: parse
verdict, schema validity, drift kind, argument diffs; or, for a pair of different requests or a cut answer, the
match status that keeps it out of the comparison (`compare.attribution`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from toolaudit.compare.attribution import NotCompared, not_compared
from toolaudit.compare.diff import diff_outputs
from toolaudit.compare.outcomes import SampleOutcome, sample_outcome
from toolaudit.compare.request_digest import describe_difference
from toolaudit.ingest import deepjson
from toolaudit.store import RowBuffer, json_text
from toolaudit.store.vocabulary import NOT_OFFERED, CallDiff, DriftKind, MatchStatus
from toolaudit.validate.records import ParsedOutput, ToolCall
from toolaudit.validate.schemas import CompiledSchema, SchemaRegistry, tool_schemas_from_request
from toolaudit.validate.toolcalls import parse_message

OFFERED_NAMED = 5  # the offered tools an error names, of a call to a tool the request did not offer

# Engine evidence columns of `outputs` (replays fill them; recorded logs have none).
EVIDENCE_COLUMNS = ("token_ids", "prompt_tokens", "completion_tokens", "latency_s", "ttft_s", "tokens_per_s",
                    "wall_share_s", "drafted_tokens", "accepted_tokens", "forward_passes", "error")


class Outcome(NamedTuple):
    """How a pair was stored: `matched` with its verdict, or a status that kept it out of the comparison."""

    status: MatchStatus
    verdict: CallDiff | None  # None when not compared
    detail: str | None = None  # why not compared

    @property
    def kind(self) -> DriftKind | None:
        return None if self.verdict is None else DriftKind(self.verdict.kind)


class Divergence(NamedTuple):
    """Where two token streams first differ, with the top-2 margin each path saw there."""

    position: int
    baseline_token: str | None
    candidate_token: str | None
    baseline_margin: float | None
    candidate_margin: float | None

    def columns(self) -> dict[str, Any]:
        return {"first_divergence": self.position, "baseline_token": self.baseline_token,
                "candidate_token": self.candidate_token, "baseline_margin": self.baseline_margin,
                "candidate_margin": self.candidate_margin}


@dataclass(frozen=True)
class OutputRow:
    """One side's answer as stored in `outputs` (everything but the key and side)."""

    path_name: str
    text: str
    tool_calls: str | None
    parse_status: str
    parse_format: str
    parse_error: str | None
    source: str | None = None
    line: int | None = None
    schema_errors: str | None = None
    system_fingerprint: str | None = None
    evidence: dict[str, Any] | None = None  # EVIDENCE_COLUMNS, for engine outputs
    finish_reason: str | None = None
    request_digest: str | None = None


@dataclass
class SideOutput:
    """One decode path's answer to one call, parsed, with where it came from."""

    parsed: ParsedOutput
    raw: str  # the exact output as emitted, for the exact-text-match column
    path_name: str
    source: str | None = None
    line: int | None = None
    system_fingerprint: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # engine evidence for the outputs table
    finish_reason: str | None = None  # as the response or engine gave it ("stop", "length", "tool_calls"...)
    request_digest: str | None = None  # of the request this answers (compare.request_digest); None: unknown
    request: dict | None = None  # that request, to say what differs when the two sides' digests do (not stored)

    def row(self, schema_errors: str | None = None) -> OutputRow:
        p = self.parsed
        return OutputRow(self.path_name, self.raw, tool_calls_json(p.calls), p.status, p.format, p.error,
                         self.source, self.line, schema_errors, self.system_fingerprint, self.extra or None,
                         self.finish_reason, self.request_digest)


def message_raw_text(message: dict | None) -> str:
    """The exact text of an OpenAI message: content plus each tool call's name and argument string."""
    if not message:
        return ""
    parts = [message.get("content") if isinstance(message.get("content"), str) else ""]
    for call in message.get("tool_calls") or ():
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            args = fn.get("arguments")
            parts.append(f"{fn.get('name')}\x00{args if isinstance(args, str) else json_text(args)}")
    return "\x01".join(parts)


def tool_calls_json(calls: tuple[ToolCall, ...]) -> str | None:
    if not calls:
        return None
    return json_text([{"name": c.name, "arguments": c.arguments if c.arguments_error is None else None,
                       **({"arguments_error": c.arguments_error, "raw_arguments": c.raw_arguments}
                          if c.arguments_error else {})} for c in calls])


def first_tool(parsed: ParsedOutput) -> str | None:
    """The name of an answer's first tool call, or None when it calls none."""
    return (parsed.calls[0].name or None) if parsed.calls else None


def recorded_tool(message: dict | None) -> str | None:
    """The recorded call's tool (`calls.recorded_tool`): the first tool call of a recorded response's message
    (`TraceCall.response_message`: OpenAI `tool_calls[].function.name`, read as `compare` reads a recorded
    answer), or None when it calls no tool or no response was recorded."""
    return first_tool(parse_message(message)) if message else None


# -- rows ---------------------------------------------------------------------------------------------------

def write_call(rows: RowBuffer, run_id: int, session_id: str, call_index: int, status: MatchStatus, *,
               customer: str | None = None, tool_name: str | None = None, kind: DriftKind | None = None,
               exact_text_match: bool | None = None, baseline_valid: bool | None = None,
               candidate_valid: bool | None = None, arg_diff_count: int | None = None, detail: str | None = None,
               divergence: Divergence | None = None, recorded_tool: str | None = None) -> None:
    """One `calls` row. `drifted` is derived from the kind, so the two can never disagree. `recorded_tool`: the
    recorded call's tool (`recorded_tool()`), None where it called none or nothing was recorded."""
    rows.add("calls", run_id=run_id, session_id=session_id, call_index=call_index, customer=customer,
              tool_name=tool_name, match_status=status.value, drift_kind=None if kind is None else kind.value,
              drifted=None if kind is None else kind.drifted, exact_text_match=exact_text_match,
              baseline_valid=baseline_valid, candidate_valid=candidate_valid, arg_diff_count=arg_diff_count,
              detail=detail, recorded_tool=recorded_tool, **(divergence.columns() if divergence else {}))


def write_output(rows: RowBuffer, run_id: int, session_id: str, call_index: int, side: str, out: OutputRow) -> None:
    """One `outputs` row for one side of one call."""
    rows.add("outputs", run_id=run_id, session_id=session_id, call_index=call_index, side=side,
              path_name=out.path_name, source=out.source, line=out.line, text=out.text, tool_calls=out.tool_calls,
              parse_status=out.parse_status, parse_format=out.parse_format, parse_error=out.parse_error,
              schema_errors=out.schema_errors, system_fingerprint=out.system_fingerprint,
              finish_reason=out.finish_reason, request_digest=out.request_digest, **(out.evidence or {}))


class Analyzer:
    """Holds the per-run caches (compiled schemas per tools list) and writes rows for each call pair."""

    def __init__(self, run_id: int, registry: SchemaRegistry):
        self.run_id = run_id
        self.registry = registry
        self._schemas_by_tools: dict[bytes, dict[str, CompiledSchema | None]] = {}
        self._reported: set[tuple[str, str]] = set()
        self.pending_issues: list[dict] = []

    def schemas_for(self, tools: list) -> dict[str, CompiledSchema | None]:
        """Compiled schemas of a request's tools, computed once per distinct tools list."""
        try:
            key = orjson.dumps(tools) if tools else b""
        except TypeError:  # nested past orjson's limit, or not JSON at all: still a stable key
            key = deepjson.dumps(tools, sort_keys=False).encode()
        cached = self._schemas_by_tools.get(key)
        if cached is not None:
            return cached
        params, problems = tool_schemas_from_request(tools)
        for problem in problems:
            self._issue("(request tools)", "request", "invalid", problem)
        compiled: dict[str, CompiledSchema | None] = {}
        for name, schema in params.items():
            compiled[name] = self.registry.get(name, schema)
        self._schemas_by_tools[key] = compiled
        return compiled

    def _schema(self, schemas: dict[str, CompiledSchema | None], name: str) -> CompiledSchema | None:
        if name in schemas:
            found = schemas[name]
        else:  # a tool the request did not offer: only a schemas/ file can describe it
            found = self.registry.get(name, None)
        if found is not None and (found.tool_name, found.source) not in self._reported:
            self._reported.add((found.tool_name, found.source))
            for warning in found.warnings:
                self._issue(found.tool_name, found.source, "warning", warning)
            if found.invalid_reason:
                self._issue(found.tool_name, found.source, "invalid", found.invalid_reason)
        return found

    @staticmethod
    def not_offered(schemas: dict[str, CompiledSchema | None], call: ToolCall, compiled: CompiledSchema | None) -> bool:
        """A call to a name the request did not offer (it offered some) and no schemas/ file describes."""
        return compiled is None and bool(schemas) and call.name not in schemas

    def validate_call(self, schemas: dict[str, CompiledSchema | None], call: ToolCall, errors: list) -> bool | None:
        """True/False when the call's schema can judge it (appending `{tool, errors}` when invalid), else None.
        A tool the request did not offer, where it offered some and no schemas/ file describes it, is invalid:
        an agent's runtime cannot run it (a small model, sampling hot above all, invents such names)."""
        compiled = self._schema(schemas, call.name)
        if self.not_offered(schemas, call, compiled):
            offered = ", ".join(sorted(schemas)[:OFFERED_NAMED])
            more = f" and {len(schemas) - OFFERED_NAMED} more" if len(schemas) > OFFERED_NAMED else ""
            errors.append({"tool": call.name, "errors": [f"{NOT_OFFERED} ({offered}{more})"]})
            return False
        if compiled is None or call.arguments_error is not None:
            return None
        errs = compiled.errors(call.arguments)
        while compiled.notes:  # out of pattern budget, or failed while applied: say so once per message
            self._issue(compiled.tool_name, compiled.source, *compiled.notes.pop(0))
        if errs:
            errors.append({"tool": call.name, "errors": errs})
        return None if errs is None else not errs

    def sample_outcome(self, tools: list, side: SideOutput, error: str | None = None) -> SampleOutcome:
        """One sample's outcome (`compare.outcomes`), validated against the request's schemas."""
        schemas = self.schemas_for(tools)
        return sample_outcome(side.parsed, side.finish_reason, error,
                              lambda call: self.validate_call(schemas, call, []),
                              lambda call: call.name not in schemas
                              and self.not_offered(schemas, call, self._schema(schemas, call.name)))

    def _issue(self, tool: str, source: str, severity: str, message: str) -> None:
        self.pending_issues.append({"tool_name": tool, "schema_source": source, "severity": severity,
                                    "message": message})

    def flush_issues(self, rows: RowBuffer) -> None:
        for issue in self.pending_issues:
            rows.add("schema_issues", run_id=self.run_id, **issue)
        self.pending_issues.clear()

    def pair(self, rows: RowBuffer, session_id: str, call_index: int, customer: str | None, tools: list,
             baseline: SideOutput, candidate: SideOutput, divergence: Divergence | None = None, *,
             recorded: str | None) -> Outcome:
        """Diff one pair and append its calls, outputs and arg_diffs rows; a pair of different requests or with a
        cut answer is stored under its own match status instead, not compared (`compare.attribution`).
        `recorded`: the recorded call's tool (a replay's trace: `recorded_tool(call.response_message)`; two recorded
        logs: the baseline's `first_tool`; None: no tool call, or nothing recorded)."""
        skipped = not_compared(baseline.request_digest, candidate.request_digest, baseline.finish_reason,
                               candidate.finish_reason,
                               lambda: describe_difference(baseline.request, candidate.request))
        if skipped is not None:
            self._not_compared(rows, session_id, call_index, customer, baseline, candidate, skipped, divergence,
                               recorded)
            return Outcome(skipped.status, None, skipped.detail)
        schemas = self.schemas_for(tools)
        errors_by_side: dict[int, list] = {}

        def validator_for(side: int) -> Callable[[ToolCall], bool | None]:
            def validate(call: ToolCall) -> bool | None:
                return self.validate_call(schemas, call, errors_by_side.setdefault(side, []))
            return validate

        # Identical pairs are validated once: the verdict is the same for both sides.
        verdict = diff_outputs(baseline.parsed, candidate.parsed, validator_for(0), validator_for(1),
                               baseline.raw == candidate.raw)
        if verdict.baseline_valid is not None and not DriftKind(verdict.kind).drifted:
            errors_by_side.setdefault(1, errors_by_side.get(0, []))
        tool_name = (baseline.parsed.calls[0].name if baseline.parsed.calls
                     else candidate.parsed.calls[0].name if candidate.parsed.calls else None)
        write_call(rows, self.run_id, session_id, call_index, MatchStatus.MATCHED, customer=customer,
                   tool_name=tool_name, kind=DriftKind(verdict.kind), exact_text_match=verdict.exact_text_match,
                   baseline_valid=verdict.baseline_valid, candidate_valid=verdict.candidate_valid,
                   arg_diff_count=len(verdict.arg_diffs), detail=verdict.detail, divergence=divergence,
                   recorded_tool=recorded)
        for side_no, (side_name, out) in enumerate((("baseline", baseline), ("candidate", candidate))):
            errors = errors_by_side.get(side_no)
            write_output(rows, self.run_id, session_id, call_index, side_name,
                         out.row(json_text(errors) if errors else None))
        for d in verdict.arg_diffs:
            rows.add("arg_diffs", run_id=self.run_id, session_id=session_id, call_index=call_index,
                      call_position=d.call_position, tool_name=d.tool_name, arg_path=d.path, diff_kind=d.kind.value,
                      baseline_value=json_text(d.baseline), candidate_value=json_text(d.candidate))
        return Outcome(MatchStatus.MATCHED, verdict)

    def _not_compared(self, rows: RowBuffer, session_id: str, call_index: int, customer: str | None,
                      baseline: SideOutput, candidate: SideOutput, why: NotCompared,
                      divergence: Divergence | None, recorded: str | None) -> None:
        """A pair kept out of the comparison: its calls row (no verdict; where the token streams part, when known)
        and both outputs, as recorded."""
        tool_name = (baseline.parsed.calls[0].name if baseline.parsed.calls
                     else candidate.parsed.calls[0].name if candidate.parsed.calls else None)
        write_call(rows, self.run_id, session_id, call_index, why.status, customer=customer, tool_name=tool_name,
                   exact_text_match=baseline.raw == candidate.raw, detail=why.detail, divergence=divergence,
                   recorded_tool=recorded)
        for side_name, out in (("baseline", baseline), ("candidate", candidate)):
            write_output(rows, self.run_id, session_id, call_index, side_name, out.row())
