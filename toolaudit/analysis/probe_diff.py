"""Two probe fingerprints of a path, compared prompt by prompt and said in words: did the runtime's numerics
change (logprobs moved, greedy choices did not), did its decisions change (an argmax flipped, and at what
margin), or neither. `fingerprint --probe --against` and `check --expect-numerics` print it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from toolaudit.replay.probe import Probe, logprob_deltas


@dataclass(frozen=True)
class Flip:
    """A prompt whose chosen tokens differ: the first step where they part and the reference's top-1 minus
    top-2 logprob margin there (None when the reference has no logprobs)."""

    prompt: int
    step: int
    margin: float | None


@dataclass(frozen=True)
class ProbeChange:
    comparable: bool  # same probe set (else nothing below is filled)
    prompts: int
    flips: list[Flip] = field(default_factory=list)
    numerics_differ: int = 0  # prompts with the same decisions and other logprobs
    max_delta: float | None = None  # the largest |delta logprob| over entries both probes hold
    numerics_known: bool = True  # both probes carry logprobs
    config_changed: bool = False
    noise: float | None = None  # the larger jitter of the two probes, when either was not stable

    @property
    def same_decisions(self) -> bool:
        return self.comparable and not self.flips

    @property
    def same(self) -> bool:
        return self.same_decisions and self.numerics_differ == 0

    @property
    def within_noise(self) -> bool:
        """The logprobs moved no more than the probes' own repeats did (a nondeterministic path)."""
        return self.noise is not None and self.max_delta is not None and self.max_delta <= self.noise

    def as_dict(self) -> dict[str, Any]:
        return {"same": self.same, "same_decisions": self.same_decisions, "comparable": self.comparable,
                "prompts": self.prompts, "flipped": [f.__dict__ for f in self.flips],
                "numerics_differ": self.numerics_differ, "max_delta": self.max_delta,
                "within_noise": self.within_noise, "config_changed": self.config_changed, "words": self.words()}

    def words(self) -> str:
        if not self.comparable:
            return "the two probes decoded different probe sets: nothing to compare (probe both with one set)"
        n = self.prompts
        delta = f" (max |delta| {self.max_delta:.3g})" if self.max_delta is not None else ""
        if self.flips:
            margins = [f"{f.margin:.3g}" for f in self.flips if f.margin is not None]
            plural = "s" if len(margins) > 1 else ""
            at = (f", at margin{plural} {_and(margins)}" if len(margins) == len(self.flips) else
                  " (margins unknown: no logprobs)")
            text = f"argmax flipped on {len(self.flips)} of {n} prompts{at}"
            if self.numerics_differ:
                text += f"; logprobs differ on {self.numerics_differ} more{delta}"
            text += ": the runtime's greedy choices changed"
        elif self.numerics_differ and self.within_noise:
            return (f"decisions identical on {n}/{n} prompts, logprobs differ on {self.numerics_differ}{delta}, "
                    f"within the jitter of the probes' own repeats (up to {self.noise:.3g}): no change beyond the "
                    "noise; config fingerprint " + ("changed" if self.config_changed else "unchanged"))
        elif self.numerics_differ:
            text = (f"decisions identical on {n}/{n} prompts, logprobs differ on {self.numerics_differ}{delta}: "
                    "the runtime's numerics changed, its greedy choices did not")
        elif not self.numerics_known:
            text = f"decisions identical on {n}/{n} prompts (no logprobs to compare)"
        else:
            text = f"identical: decisions and logprobs bit for bit on {n}/{n} prompts"
        if self.noise is not None:
            text += (f" (a probe's own repeats were not bit-identical, jitter up to {self.noise:.3g}: logprob "
                     "differences that size are noise)")
        if not self.same:
            text += "; config fingerprint " + ("changed too" if self.config_changed else "unchanged")
        return text


def compare_probes(reference: Probe, current: Probe) -> ProbeChange:
    """What changed from `reference` to `current` (both of one path, or of paths meant to decode alike)."""
    if reference.probe_set != current.probe_set or len(reference.traces) != len(current.traces):
        return ProbeChange(False, current.prompts)
    flips, differ, deltas = [], 0, []
    for i, (a, b) in enumerate(zip(reference.traces, current.traces)):
        deltas += logprob_deltas(a, b)
        if a.tokens != b.tokens:
            step = next((j for j, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y),
                        min(len(a.tokens), len(b.tokens)))
            flips.append(Flip(i, step, a.margins[step] if step < len(a.margins) else None))
        elif a.top != b.top:
            differ += 1
    jitters = [p.jitter_max for p in (reference, current) if not p.stable and p.jitter_max is not None]
    return ProbeChange(True, len(current.traces), flips, differ, max(deltas) if deltas else None,
                       bool(reference.numerics and current.numerics),
                       reference.config_fingerprint != current.config_fingerprint,
                       max(jitters) if jitters else None)


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
