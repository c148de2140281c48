"""Which spans of an export request the receiver keeps: model calls and the spans that carry their context.

A service exports every span it makes (HTTP handlers, database calls...); only spans the readers can use are
worth keeping: spans with an attribute of a GenAI or LLM convention (`gen_ai.`, `llm.`, `openinference.`,
`langfuse.`, `traceloop.`) or one that names a session or user (`session.id`, `user.id`, `enduser.id`) or
holds a model's input or output (`input.value`, `output.value`). Parent spans that carry a session for their
children (an agent's `invoke_agent` span, a Langfuse trace span) match one of these too. Span attributes are
judged, not the resource's: a resource attribute such as `user.id` would keep every span of the service.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from toolaudit.collect.otlp_json import span_problem

PREFIXES = ("gen_ai.", "llm.", "openinference.", "langfuse.", "traceloop.")
KEYS = frozenset({"session.id", "user.id", "enduser.id", "input.value", "output.value"})


@dataclass
class Kept:
    """An export request with only its kept spans (None when it kept none), and how every span was judged."""

    request: dict | None
    kept: int = 0
    dropped: int = 0  # spans that are not model calls or their context: accepted, not stored
    rejected: int = 0  # spans the receiver could not accept (no ids): reported as partial success
    reasons: list[str] = field(default_factory=list)  # one message per distinct rejection reason

    @property
    def message(self) -> str:
        return "; ".join(self.reasons)


def is_llm_span(span: dict) -> bool:
    attrs = span.get("attributes")
    for attr in attrs if isinstance(attrs, list) else []:
        key = attr.get("key") if isinstance(attr, dict) else None
        if isinstance(key, str) and (key in KEYS or key.startswith(PREFIXES)):
            return True
    return False


def keep_llm_spans(request: dict) -> Kept:
    """The request with its LLM spans only (scopes and resources left empty dropped)."""
    out = Kept(None)
    kept_resources = []
    for rs in request.get("resourceSpans", []):
        kept_scopes = []
        for scope in rs.get("scopeSpans", []):
            spans = []
            for span in scope.get("spans", []):
                problem = span_problem(span)
                if problem is not None:
                    out.rejected += 1
                    if problem not in out.reasons:
                        out.reasons.append(problem)
                elif is_llm_span(span):
                    spans.append(span)
                else:
                    out.dropped += 1
            if spans:
                kept_scopes.append(_with(scope, spans=spans))
        if kept_scopes:
            kept_resources.append(_with(rs, scopeSpans=kept_scopes))
    out.kept = sum(len(s["spans"]) for rs in kept_resources for s in rs["scopeSpans"])
    if kept_resources:
        out.request = {"resourceSpans": kept_resources}
    if out.rejected:
        out.reasons = [f"{out.rejected} span(s) rejected: " + ", ".join(out.reasons)]
    return out


def _with(container: dict, **replaced: Any) -> dict:
    return {**container, **replaced}
