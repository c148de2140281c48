"""Which spans and log records of an export request the receiver keeps: model calls, the spans that carry their
context, and the GenAI log records that carry a call's content for its span.

A service exports every span it makes (HTTP handlers, database calls...); only spans the readers can use are
worth keeping: spans with an attribute of a GenAI or LLM convention (`gen_ai.`, `llm.`, `openinference.`,
`langfuse.`, `traceloop.`) or one that names a session or user (`session.id`, `user.id`, `enduser.id`) or
holds a model's input or output (`input.value`, `output.value`). Parent spans that carry a session for their
children (an agent's `invoke_agent` span, a Langfuse trace span) match one of these too. Span attributes are
judged, not the resource's: a resource attribute such as `user.id` would keep every span of the service.

Log records (the official OpenAI instrumentation's event mode sends the content as logs) are kept when they
name a span (the reader joins them to it by trace and span id) and are GenAI records: an event name or an
attribute starting `gen_ai.`, or a body that carries a message (`content`, `message`, `tool_calls`).

Credentials an SDK writes into the data itself are cut out too (request headers are never stored anyway): the
Langfuse SDK names its project's `public_key` in its instrumentation scope's attributes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from toolaudit.collect.otlp_json import LOGS, TRACES, Signal, item_problem

PREFIXES = ("gen_ai.", "llm.", "openinference.", "langfuse.", "traceloop.")
KEYS = frozenset({"session.id", "user.id", "enduser.id", "input.value", "output.value"})
MESSAGE_BODY_KEYS = frozenset({"content", "message", "tool_calls"})
SCOPE_SECRETS = frozenset({"public_key", "secret_key"})  # the Langfuse SDK's scope attributes


@dataclass
class Kept:
    """An export request with only its kept items (None when it kept none), and how every item was judged."""

    request: dict | None
    kept: int = 0
    dropped: int = 0  # items that are not model calls or their context: accepted, not stored
    rejected: int = 0  # items the receiver could not accept (no ids): reported as partial success
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


def is_genai_log(record: dict) -> bool:
    """A log record that names a span and carries GenAI content for it."""
    if not record.get("traceId") or not record.get("spanId") or int(record["spanId"], 16) == 0:
        return False
    name = record.get("eventName")
    if isinstance(name, str) and name.startswith("gen_ai."):
        return True
    attrs = record.get("attributes")
    for attr in attrs if isinstance(attrs, list) else []:
        key = attr.get("key") if isinstance(attr, dict) else None
        if isinstance(key, str) and key.startswith("gen_ai."):
            return True
    body = record.get("body")
    entries = ((body.get("kvlistValue") or {}).get("values") if isinstance(body, dict) else None) or []
    return any(isinstance(e, dict) and e.get("key") in MESSAGE_BODY_KEYS for e in entries)


def keep_llm_spans(request: dict) -> Kept:
    """The request with its LLM spans only (scopes and resources left empty dropped)."""
    return keep_items(request, TRACES, is_llm_span)


def keep_genai_logs(request: dict) -> Kept:
    """The request with its GenAI log records only."""
    return keep_items(request, LOGS, is_genai_log)


def keep_items(request: dict, signal: Signal, wanted: Callable[[dict], bool]) -> Kept:
    """The request with the items `wanted` accepts (scopes and resources left empty dropped)."""
    out = Kept(None)
    kept_resources = []
    for rs in request.get(signal.resources, []):
        kept_scopes = []
        for scope in rs.get(signal.scopes, []):
            kept_items = []
            for item in scope.get(signal.items, []):
                problem = item_problem(item, signal)
                if problem is not None:
                    out.rejected += 1
                    if problem not in out.reasons:
                        out.reasons.append(problem)
                elif wanted(item):
                    kept_items.append(item)
                else:
                    out.dropped += 1
            if kept_items:
                kept_scopes.append(_with(_without_secrets(scope), **{signal.items: kept_items}))
        if kept_scopes:
            kept_resources.append(_with(rs, **{signal.scopes: kept_scopes}))
    out.kept = sum(len(s[signal.items]) for rs in kept_resources for s in rs[signal.scopes])
    if kept_resources:
        out.request = {signal.resources: kept_resources}
    if out.rejected:
        out.reasons = [f"{out.rejected} {signal.name}(s) rejected: " + ", ".join(out.reasons)]
    return out


def _without_secrets(scope: dict) -> dict:
    """The scope without attributes that hold credentials."""
    about = scope.get("scope")
    attrs = about.get("attributes") if isinstance(about, dict) else None
    if not isinstance(attrs, list):
        return scope
    kept = [a for a in attrs if not (isinstance(a, dict) and a.get("key") in SCOPE_SECRETS)]
    return scope if len(kept) == len(attrs) else {**scope, "scope": {**about, "attributes": kept}}


def _with(container: dict, **replaced: Any) -> dict:
    return {**container, **replaced}
