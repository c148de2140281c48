"""Never a silent nothing: a comparison that pairs no calls, or far fewer than its logs hold, is a failure with
the reason and the likely fix, not a run that "passed" on zero calls.

Calls pair up by (session, call index). When two recordings of the same traffic pair almost nothing, the
session key is the usual culprit: each call became its own session (the trace id, the fallback for spans
without a session attribute) and the two recordings' trace ids differ. Official OpenTelemetry and OpenLLMetry
instrumentations carry the session as baggage (`session.id`), not as `gen_ai.conversation.id`.
"""

from __future__ import annotations

from .logs import RunCounts

FEWER_THAN = 0.5  # pairs below this share of the smaller side's calls fail the comparison


def pairing_problem(counts: RunCounts, session_key: str) -> str | None:
    """Why this comparison's pairing cannot be trusted, with the likely fix; None when it paired enough calls."""
    baseline = counts.matched + counts.baseline_only
    candidate = counts.matched + counts.candidate_only
    smaller = min(baseline, candidate)
    if smaller == 0 or counts.matched >= FEWER_THAN * smaller:
        return None
    what = "no calls" if counts.matched == 0 else f"only {counts.matched} calls"
    return (f"{what} paired between the logs (baseline {baseline} calls, candidate {candidate}; calls pair up by "
            f"session and call index): the sessions differ between the files. Is the session in another field? "
            f"The session key now is {session_key!r}; spans from the official OpenTelemetry or OpenLLMetry "
            f"instrumentation carry it as `session.id` (--session-key session.id), line logs as a dotted path "
            f"(--session-key request.metadata.session_id). The run is stored; `toolaudit show` lists its "
            f"unmatched calls.")
