"""Drift statistics: per-call rates with Wilson intervals and compounded per-session probabilities.

Wilson rather than the normal approximation because drift rates are small (around 1%) and the normal
interval then dips below zero and under-covers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

Z95 = 1.959963984540054


@dataclass(frozen=True)
class Rate:
    """k events out of n trials, with a 95% Wilson interval."""

    k: int
    n: int
    low: float
    high: float

    @property
    def p(self) -> float:
        return self.k / self.n if self.n else 0.0

    @property
    def width(self) -> float:
        """How far apart the interval's ends are: what more calls would narrow (the floor's resolution)."""
        return self.high - self.low


def wilson(k: int, n: int, z: float = Z95) -> Rate:
    """Wilson score interval for k successes out of n."""
    if n <= 0:
        return Rate(k, n, 0.0, 1.0)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    low = 0.0 if k == 0 else max(0.0, centre - half)  # exact ends: no 1e-18 from rounding
    high = 1.0 if k == n else min(1.0, centre + half)
    return Rate(k, n, low, high)


def expected_session_drift(p_call: float, max_calls: int = 10) -> list[tuple[int, float]]:
    """Expected share of sessions with any drift for sessions of 1..max_calls calls at a per-call rate."""
    return [(n, 1.0 - (1.0 - p_call) ** n) for n in range(1, max_calls + 1)]


@dataclass(frozen=True)
class Difference:
    """`new.p - old.p` with a 95% interval (Newcombe's hybrid score interval)."""

    estimate: float
    low: float
    high: float

    @property
    def significant_increase(self) -> bool:
        """The whole interval is above zero: the rise is unlikely to be sampling noise (one-sided 2.5%)."""
        return self.low > 0.0


def newcombe(new: Rate, old: Rate) -> Difference:
    """Interval for the difference of two independent proportions from their Wilson intervals (Newcombe 1998,
    method 10). Unlike the Wald interval it stays inside [-1, 1] and keeps its coverage for rates near 0 and
    for small or unequal samples; unlike comparing the two intervals it is not too wide (overlapping 95%
    intervals do not mean "no significant difference")."""
    d = new.p - old.p
    low = d - math.sqrt((new.p - new.low) ** 2 + (old.high - old.p) ** 2)
    high = d + math.sqrt((new.high - new.p) ** 2 + (old.p - old.low) ** 2)
    return Difference(d, max(-1.0, low), min(1.0, high))


def paired_difference(only_a: int, only_b: int, n: int, z: float = Z95) -> Difference:
    """Rate of A minus rate of B measured on the same n items (a candidate and its noise floor on the same calls),
    with a 95% interval: Agresti & Min (2005), a Wald interval on the discordant pairs after adding 1/2 to each
    cell of the 2x2 table (coverage near nominal even with few discordant pairs, where plain Wald collapses).
    Only discordant items move the difference: items both drifted on are not A's doing."""
    if n == 0:
        return Difference(0.0, 0.0, 0.0)
    m = n + 2
    pa, pb = (only_a + 0.5) / m, (only_b + 0.5) / m
    d = pa - pb
    half = z * math.sqrt(max(pa + pb - d * d, 0.0) / m)
    return Difference((only_a - only_b) / n, max(-1.0, d - half), min(1.0, d + half))
