"""How two recorded logs pair their calls: by (session, call index), or by request digest and occurrence.

Pairing by session is the default: it keeps the user's sessions, and every pair is still checked to be the
same request (a pair whose request digests differ is stored as `mismatched`, never drift). Pairing by request
(`request-<digest>` as the session, the occurrence among calls with that digest as the call index) is for logs
whose session key cannot pair them:

- no call of a log carries a session at the key (logs without session metadata), or
- every call of a log shares one session (a key such as `request.model`: calls then pair by line order), and
  pairing by it puts different requests together.

`--pair-by auto` (the default) picks request pairing in those two cases only; `session` and `request` force a
mode. Pairing by request loses the sessions (each distinct request is its own session in the store, so the
session figures count single calls) and cannot be sharded (a shard holds whole sessions).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from toolaudit import ConfigError

MODES = ("auto", "session", "request")
SIDES = ("baseline", "candidate")


@dataclass(frozen=True)
class Pairing:
    """The mode a comparison paired its calls in, and why (stored in the run's counts as `pairing`)."""

    by: str  # "session" | "request"
    reason: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def choose(pair_by: str, sides: dict[int, tuple[int, int, int]], session_key: str,
           mismatched_by_session: Callable[[], int]) -> Pairing:
    """The pairing mode. `sides`: per side (0 baseline, 1 candidate), (calls, calls without a session, distinct
    sessions of the others); `mismatched_by_session()` counts the pairs of different requests that pairing by
    session would make (asked only when a log's calls all share one session)."""
    if pair_by not in MODES:
        raise ConfigError(f"--pair-by must be one of {', '.join(MODES)} (got {pair_by!r})")
    if pair_by != "auto":
        return Pairing(pair_by, f"--pair-by {pair_by}")
    for side, (calls, without, _) in sorted(sides.items()):
        if calls and without == calls:
            return Pairing("request", f"no {SIDES[side]} call carries a session at {session_key}")
    shared = [SIDES[side] for side, (calls, without, sessions) in sorted(sides.items())
              if calls >= 2 and not without and sessions == 1]
    if shared:
        mismatched = mismatched_by_session()
        if mismatched:
            return Pairing("request", f"every {shared[0]} call shares one session at {session_key}, and pairing "
                                      f"by it put {mismatched} different requests together")
    return Pairing("session", f"by session ({session_key}) and call index")
