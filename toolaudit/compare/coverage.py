"""Never a silent nothing: a comparison that pairs no calls, or far fewer than its logs hold, is a failure with
the reason and the likely fix, not a run that "passed" on zero calls.

Calls pair up by (session, call index). When two recordings of the same traffic pair almost nothing, the
session key is the usual culprit: each call became its own session (the trace id, the fallback for spans
without a session attribute) and the two recordings' trace ids differ. Official OpenTelemetry and OpenLLMetry
instrumentations carry the session as baggage (`session.id`), not as `gen_ai.conversation.id`.
"""

from __future__ import annotations

from toolaudit.compare.attribution import MISMATCH_HINT

from .logs import RunCounts

FEWER_THAN = 0.5  # pairs below this share of the smaller side's calls fail the comparison


def pairing_problem(counts: RunCounts, session_key: str) -> str | None:
    """Why this comparison's pairing cannot be trusted, with the likely fix; None when it paired enough calls."""
    paired = counts.matched + counts.truncated + counts.mismatched  # keys found in both logs
    baseline = paired + counts.baseline_only
    candidate = paired + counts.candidate_only
    smaller = min(baseline, candidate)
    if smaller == 0 or paired >= FEWER_THAN * smaller:
        return None
    what = "no calls" if paired == 0 else f"only {paired} calls"
    return (f"{what} paired between the logs (baseline {baseline} calls, candidate {candidate}; calls pair up by "
            f"session and call index): the sessions differ between the files. Is the session in another field? "
            f"The session key now is {session_key!r}; spans from the official OpenTelemetry or OpenLLMetry "
            f"instrumentation carry it as `session.id` (--session-key session.id), line logs as a dotted path "
            f"(--session-key request.metadata.session_id). The run is stored; `toolaudit show` lists its "
            f"unmatched calls.")


def mismatch_problem(counts: RunCounts, max_mismatched: float) -> str | None:
    """Why this comparison fails on its mismatched pairs (pairs of different requests, stored but not compared),
    naming the first few and what differs; None when their share of the paired calls is within `max_mismatched`
    (0: any mismatch fails, since the rest of the pairing then cannot be trusted either)."""
    paired = counts.matched + counts.truncated + counts.mismatched
    if not counts.mismatched or counts.mismatched <= max_mismatched * paired:
        return None
    shown = "; ".join(f"session {m['session_id']!r} call {m['call_index']} (baseline line {m['baseline_line']}, "
                      f"candidate line {m['candidate_line']}): {m['detail'].removeprefix('different requests: ')}"
                      for m in counts.mismatches[:3])
    more = counts.mismatched - min(3, len(counts.mismatches))
    return (f"{counts.mismatched} of {paired} paired calls ({100 * counts.mismatched / paired:.2f}%, over "
            f"--max-mismatched {100 * max_mismatched:g}%) answer different requests, and are not compared: "
            f"{shown}{f'; {more} more' if more > 0 else ''}. {MISMATCH_HINT[0].upper()}{MISMATCH_HINT[1:]}. "
            f"The run is stored; its drift figures leave the mismatched pairs out.")
