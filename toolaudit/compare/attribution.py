"""Only the candidate's doing may count as drift: which pairs are not compared, and why.

Two things make a difference between two answers someone else's doing:

- `mismatched`: the two sides answer different requests (their request digests differ,
  `compare.request_digest`): the pairing put them together (swapped session metadata, a session key that does
  not separate sessions, live recordings whose histories went apart), not the candidate.
- `truncated`: either side stopped at max_tokens (finish reason `length`). A cut answer is partial or
  unparseable whatever the decode path; comparing it measures the limit, not the candidate. Both sides cut
  the same way is not agreement either: the answers were never finished.

Such pairs are stored with both outputs under a match status of their own (`MatchStatus.MISMATCHED`,
`MatchStatus.TRUNCATED`) and counted apart: they are in neither the numerator nor the denominator of any drift
figure (every figure counts `matched` pairs only). A mismatch is checked first: a pair of different requests is
wrong whatever its answers. The same rule holds for `compare` (decided in SQL for the pairs that agree,
`store.staging`), `replay` and `batch import` (decided here, through `pairs.Analyzer`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from toolaudit.store.vocabulary import LENGTH, TRUNCATED_BOTH, TRUNCATED_ONE, MatchStatus

TRUNCATION_HINT = ("raise max_tokens if the answers need the room (a runaway generation, one that repeats itself, "
                   "is cut at any limit: then the cut is the finding)")
MISMATCH_HINT = "check --session-key (it must separate sessions), or pair by request (--pair-by request)"


@dataclass(frozen=True)
class NotCompared:
    """Why a pair is stored but not compared."""

    status: MatchStatus
    detail: str


def truncation_detail(baseline_finish: str | None, candidate_finish: str | None) -> str | None:
    """The detail of a truncated pair, or None when neither side stopped at max_tokens."""
    b, c = baseline_finish == LENGTH, candidate_finish == LENGTH
    if b and c:
        return TRUNCATED_BOTH
    if b or c:
        cut, other, reason = ("baseline", "candidate", candidate_finish) if b else ("candidate", "baseline",
                                                                                   baseline_finish)
        return TRUNCATED_ONE.format(side=cut, other=other) + (reason or "no finish reason")
    return None


def not_compared(baseline_digest: str | None, candidate_digest: str | None, baseline_finish: str | None,
                 candidate_finish: str | None, describe: Callable[[], str]) -> NotCompared | None:
    """Whether a pair is left out of the comparison (a digest not known on a side is not a mismatch);
    `describe` says what differs between the two requests, asked only for a mismatch."""
    if baseline_digest is not None and candidate_digest is not None and baseline_digest != candidate_digest:
        return NotCompared(MatchStatus.MISMATCHED, f"different requests: {describe()}")
    detail = truncation_detail(baseline_finish, candidate_finish)
    if detail is not None:
        return NotCompared(MatchStatus.TRUNCATED, detail)
    return None
