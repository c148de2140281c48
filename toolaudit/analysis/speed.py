"""A decode path's speed on a slice of a run: one definition that `summary`, `frontier`, `history`, `check` and
every report read, so a run (or a customer) has one tokens/s and one acceptance wherever it is shown.

tokens/s is the tokens a path generated over the wall time its engine spent generating them, counting every call
the path decoded (matched or not: a truncated call costs decode time too). A replay times its engine per chunk
of calls and gives each call an equal share of the chunk's wall time (stored with its output as
`outputs.tokens_per_s`); a slice's figure (the run, or a customer) is its calls' tokens over their shares. For a
run that is the chunks' tokens over their wall time (`path_performance`, the engine's own accounting) except
that calls which produced no token (engine errors) count in `path_performance` only. Acceptance is accepted over
drafted proposals of the same calls. The SQL lives in the `frontier` / `customer_frontier` views
(store/views.py), which this reads; recorded logs have no timings (None).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toolaudit.store import Store
from toolaudit.store import queries as q


@dataclass(frozen=True)
class Speed:
    baseline_tokens_per_s: float | None = None
    candidate_tokens_per_s: float | None = None
    acceptance_rate: float | None = None  # the candidate's accepted / drafted speculative tokens
    tokens_per_forward_pass: float | None = None  # the candidate's
    # Whether each path was charged its own prompts' prefill (runs since migration 15: `replay_chunks.
    # reused_prefill_s`); False for older runs, whose first path paid every path's prefill (a candidate decoded
    # after it reads fast); None without timings. `history` marks the False ones.
    prefill_charged: bool | None = None

    @property
    def speedup(self) -> float | None:
        base, cand = self.baseline_tokens_per_s, self.candidate_tokens_per_s
        return cand / base if base and cand else None

    def as_dict(self) -> dict[str, Any]:
        return {"baseline_tokens_per_s": self.baseline_tokens_per_s,
                "candidate_tokens_per_s": self.candidate_tokens_per_s, "speedup": self.speedup,
                "acceptance_rate": self.acceptance_rate, "tokens_per_forward_pass": self.tokens_per_forward_pass,
                "prefill_charged": self.prefill_charged}


def speed(store: Store, run_id: int, customer: str | None = None) -> Speed:
    """The run's (or one customer's) speed; all None for a run without timings or without matched calls."""
    row = q.speed_row(store, run_id, customer)
    if row is None:
        return Speed()
    return Speed(*(None if row[k] is None else float(row[k]) for k in q.SPEED_COLUMNS),
                 prefill_charged=q.prefill_charged(store, run_id))
