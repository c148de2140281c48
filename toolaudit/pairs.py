"""Turn one matched call pair into rows: parse verdict, schema validity, drift kind, argument diffs.

Shared by `compare` (two recorded logs) and `replay` (two live decode paths): both hand over a `SideOutput`
per path and get the same rows, so their tables agree column for column.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from toolaudit.diff import diff_outputs
from toolaudit.records import CallDiff, ParsedOutput, ToolCall
from toolaudit.schemas import CompiledSchema, SchemaRegistry, tool_schemas_from_request
from toolaudit.store import RowBatch, json_text


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


EVIDENCE_COLUMNS = ("token_ids", "prompt_tokens", "completion_tokens", "latency_s", "ttft_s", "tokens_per_s",
                    "drafted_tokens", "accepted_tokens", "forward_passes", "error")
_NO_EVIDENCE = (None,) * len(EVIDENCE_COLUMNS)
_NO_DIVERGENCE = (None,) * 5


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
        key = orjson.dumps(tools) if tools else b""
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

    def validate_call(self, schemas: dict[str, CompiledSchema | None], call: ToolCall, errors: list) -> bool | None:
        """True/False when the call's schema can judge it (appending `{tool, errors}` when invalid), else None."""
        compiled = self._schema(schemas, call.name)
        if compiled is None or call.arguments_error is not None:
            return None
        errs = compiled.errors(call.arguments)
        if errs:
            errors.append({"tool": call.name, "errors": errs})
        return None if errs is None else not errs

    def _issue(self, tool: str, source: str, severity: str, message: str) -> None:
        self.pending_issues.append({"tool_name": tool, "schema_source": source, "severity": severity,
                                    "message": message})

    def flush_issues(self, batch: RowBatch) -> None:
        for issue in self.pending_issues:
            batch.add("schema_issues", run_id=self.run_id, **issue)
        self.pending_issues.clear()

    def pair(self, batch: RowBatch, session_id: str, call_index: int, customer: str | None, tools: list,
             baseline: SideOutput, candidate: SideOutput, divergence: tuple | None = None) -> CallDiff:
        """Diff one matched pair and append its calls, outputs and arg_diffs rows.

        `divergence` is (first_divergence, baseline_token, candidate_token, baseline_margin, candidate_margin)
        when both paths returned token evidence.
        """
        schemas = self.schemas_for(tools)
        errors_by_side: dict[int, list] = {}

        def validator_for(side: int) -> Callable[[ToolCall], bool | None]:
            def validate(call: ToolCall) -> bool | None:
                return self.validate_call(schemas, call, errors_by_side.setdefault(side, []))
            return validate

        # Identical pairs are validated once: the verdict is the same for both sides.
        verdict = diff_outputs(baseline.parsed, candidate.parsed, validator_for(0), validator_for(1),
                               baseline.raw == candidate.raw)
        if verdict.baseline_valid is not None and verdict.kind in ("identical", "text_only"):
            errors_by_side.setdefault(1, errors_by_side.get(0, []))
        tool_name = (baseline.parsed.calls[0].name if baseline.parsed.calls
                     else candidate.parsed.calls[0].name if candidate.parsed.calls else None)
        div = divergence or _NO_DIVERGENCE
        batch.add_tuple("calls", (self.run_id, session_id, call_index, customer, tool_name, "matched", verdict.kind,
                                  verdict.drifted, verdict.exact_text_match, verdict.baseline_valid,
                                  verdict.candidate_valid, len(verdict.arg_diffs), verdict.detail) + div)
        for side_no, (side_name, out) in enumerate((("baseline", baseline), ("candidate", candidate))):
            self.add_output(batch, session_id, call_index, side_name, out,
                            json_text(errors_by_side.get(side_no)) if errors_by_side.get(side_no) else None)
        for d in verdict.arg_diffs:
            batch.add("arg_diffs", run_id=self.run_id, session_id=session_id, call_index=call_index,
                      call_position=d.call_position, tool_name=d.tool_name, arg_path=d.path, diff_kind=d.kind,
                      baseline_value=json_text(d.baseline), candidate_value=json_text(d.candidate))
        return verdict

    def unmatched(self, batch: RowBatch, session_id: str, call_index: int, customer: str | None,
                  side_name: str, out: SideOutput) -> None:
        """A call present in one log only: counted, stored, never treated as drift."""
        tool_name = out.parsed.calls[0].name if out.parsed.calls else None
        batch.add("calls", run_id=self.run_id, session_id=session_id, call_index=call_index, customer=customer,
                  tool_name=tool_name, match_status=f"{side_name}_only",
                  detail=f"present in the {side_name} log only")
        self.add_output(batch, session_id, call_index, side_name, out, None)

    def add_output(self, batch: RowBatch, session_id: str, call_index: int, side: str, out: SideOutput,
                   schema_errors: str | None) -> None:
        p = out.parsed
        row = (self.run_id, session_id, call_index, side, out.path_name, out.source, out.line, out.raw,
               tool_calls_json(p.calls), p.status, p.format, p.error, schema_errors, out.system_fingerprint)
        if out.extra:
            ev = out.extra
            row += tuple(ev.get(name) for name in EVIDENCE_COLUMNS)
        else:
            row += _NO_EVIDENCE
        batch.add_tuple("outputs", row)
