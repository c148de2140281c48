"""What a call span inherits: its session and customer from its nearest ancestor that carries them, else from
the first span of its trace that does. Instrumentations often put `session.id`, `user.id` or
`gen_ai.conversation.id` only on the agent span around the model calls, which ends, and is exported, after them;
so every span of the export is added first (`Family.add`), then each call asks (`Family.inherited`). One
mechanism for the OTLP exports (settled across parallel ranges, `otlp_export`) and Phoenix's span JSON (read
whole, `phoenix`).
"""

from __future__ import annotations

from dataclasses import dataclass

from toolaudit.ingest.formats.base import Keys
from toolaudit.ingest.formats.otlp import Span

MAX_DEPTH = 10_000  # parent hops followed (a cyclic parent chain in a broken export ends here)
Ids = tuple[str, str]  # (trace id, span id)
Found = tuple[str | None, str | None]  # (session, customer) a span carries itself


@dataclass(frozen=True)
class Context:
    """Where a convention keeps a call's session and customer: attributes looked up on a span, then its resource,
    first present wins (`--session-key` / `--customer-key` name one instead)."""

    session: tuple[str, ...]
    customer: tuple[str, ...]

    def of(self, span: Span, keys: Keys) -> Found | None:
        """The session and customer the span carries itself; None when it carries neither."""
        found = (span.session(keys, self.session), span.customer(keys, self.customer))
        return found if found != (None, None) else None


class Family:
    """The session and customer every span carries itself, by span and by trace (each span once)."""

    def __init__(self) -> None:
        self.spans: dict[Ids, tuple[str | None, Found | None]] = {}
        self.traces: dict[str, list[str | None]] = {}

    def add(self, ids: Ids, parent: str | None, found: Found | None) -> None:
        trace, _ = ids
        self.spans[ids] = (parent, found)
        if found is not None:
            first = self.traces.setdefault(trace, [None, None])
            first[0] = first[0] or found[0]
            first[1] = first[1] or found[1]

    def inherited(self, ids: Ids, parent: str | None, found: Found | None) -> Found:
        """The span's own session and customer, else its nearest ancestor's, else its trace's first."""
        session, customer = found or (None, None)
        trace = ids[0]
        hops = 0
        while (session is None or customer is None) and parent is not None and hops < MAX_DEPTH:
            up = self.spans.get((trace, parent))
            if up is None:
                break
            parent, above = up
            if above is not None:
                session, customer = session or above[0], customer or above[1]
            hops += 1
        if session is None or customer is None:
            first = self.traces.get(trace)
            if first is not None:
                session, customer = session or first[0], customer or first[1]
        return session, customer
