"""PROVISIONAL (replaced by the full module from the sampling-stats branch at merge): the per-call test."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class CallTest:
    n_baseline: int
    n_candidate: int
    outcomes: int
    statistic: float | None
    p_value: float | None
    tv: float | None
    tv_low: float | None
    tv_high: float | None


def call_test(baseline: Sequence[str], candidate: Sequence[str], seed: int, resamples: int = 9999) -> CallTest:
    labels = sorted(set(baseline) | set(candidate))
    code = {o: i for i, o in enumerate(labels)}
    b = np.array([code[o] for o in baseline], dtype=np.int64)
    c = np.array([code[o] for o in candidate], dtype=np.int64)
    k = len(labels)
    if len(b) == 0 or len(c) == 0:
        return CallTest(len(b), len(c), k, None, None, None, None, None)
    tv = 0.5 * float(np.abs(np.bincount(b, minlength=k) / len(b) - np.bincount(c, minlength=k) / len(c)).sum())
    if len(b) < 2 or len(c) < 2:
        return CallTest(len(b), len(c), k, None, None, tv, None, None)
    if k == 1:
        return CallTest(len(b), len(c), k, 0.0, 1.0, 0.0, 0.0, 0.0)

    def g(x, y, axis=-1):
        cx = np.stack([(x == j).sum(axis=axis) for j in range(k)], -1).astype(float)
        cy = np.stack([(y == j).sum(axis=axis) for j in range(k)], -1).astype(float)
        tot = cx + cy
        ex = tot * x.shape[axis] / (x.shape[axis] + y.shape[axis])
        ey = tot - ex
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(cx > 0, cx * np.log(cx / ex), 0.0) + np.where(cy > 0, cy * np.log(cy / ey), 0.0)
        return 2 * terms.sum(-1)

    res = stats.permutation_test((b, c), g, permutation_type="independent", vectorized=True,
                                 n_resamples=resamples, alternative="greater", random_state=seed)
    return CallTest(len(b), len(c), k, float(res.statistic), float(res.pvalue), tv, None, None)
