"""A sampled call's outcomes seen through more than their full label, so the test sees a shift in one argument.

At temperature > 0 a tool call's free-text arguments make nearly every sample's canonical signature unique:
two samples of one distribution rarely match, so a test of the signatures alone has no power (every split of
2N distinct labels gives the same table). The outcome still tells a lot: which tool, and each argument's value
(a `limit` of 50 or 500, a `status`, a flag), where values repeat. The call's statistic is therefore the sum of
the G statistics of several projections of the same samples: the full label, the tool (or the word for no
call), and for each tool each top-level argument's value among the samples calling it ("<absent>" where such a
sample leaves it out). The projections are read back from the labels `compare.outcomes.signature_label` writes
(`name{canonical JSON}`), so stored runs are tested the same way.

Under the null (one distribution on both sides) the samples are exchangeable whatever the projection, so the
permutation test of the summed statistic is exact: the same random (or, for small N, every) split of the pooled
samples relabels every projection at once, keeping their dependence.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence

import numpy as np
from scipy import special

from toolaudit.compare.diff import canonical_json

_DECODER = json.JSONDecoder()
ABSENT = "<absent>"
_CHUNK = 2048  # splits evaluated at once (memory: chunk x samples x columns floats)


def _parse(label: str) -> tuple[str, dict] | None:
    """The first call's tool name and arguments of a signature label, None for a kind word or anything else."""
    brace = label.find("{")
    if brace <= 0:
        return None
    try:
        args, _ = _DECODER.raw_decode(label, brace)
    except ValueError:
        return None
    return (label[:brace], args) if isinstance(args, dict) else None


def _value(arguments: dict, key: str) -> str:
    """One argument's value as the canonical JSON diff compares (`ABSENT` when the call leaves it out)."""
    return canonical_json(arguments[key]).decode() if key in arguments else ABSENT


class Projections:
    """The pooled samples of one call (baseline first) as one-hot columns of every projection, and the summed G
    of any split of them into the two sides."""

    def __init__(self, baseline: Sequence[str], candidate: Sequence[str]):
        labels = [*baseline, *candidate]
        self.n_baseline, self.n = len(baseline), len(labels)
        parsed = [_parse(label) for label in labels]
        columns: list[list[str | None]] = [labels, [p[0] if p else label for p, label in zip(parsed, labels)]]
        tools = sorted({p[0] for p in parsed if p})
        for tool in tools:
            keys = sorted({k for p in parsed if p and p[0] == tool for k in p[1]})
            for key in keys:
                columns.append([_value(p[1], key) if p and p[0] == tool else None for p in parsed])
        self.projections = len(columns)
        blocks, starts, width = [], [], 0
        for values in columns:
            index = {v: i for i, v in enumerate(sorted({v for v in values if v is not None}))}
            block = np.zeros((self.n, max(1, len(index))))
            for row, v in enumerate(values):
                if v is not None:
                    block[row, index[v]] = 1.0
            blocks.append(block)
            starts.append(width)
            width += block.shape[1]
        self.onehot = np.concatenate(blocks, axis=1)  # [samples, columns]
        self.starts = np.asarray(starts)
        self.total = self.onehot.sum(axis=0)
        self._col_term = np.add.reduceat(special.xlogy(self.total, self.total), self.starts)

    @property
    def useful(self) -> bool:
        """More than the full label to look at: some sample is a tool call whose arguments can be read."""
        return self.projections > 2

    def statistic(self, masks: np.ndarray) -> np.ndarray:
        """Summed G of each split: `masks` [splits, samples] is True for the samples on the baseline side."""
        out = np.empty(masks.shape[0])
        for lo in range(0, masks.shape[0], _CHUNK):
            cx = masks[lo:lo + _CHUNK].astype(float) @ self.onehot
            cy = self.total - cx
            nx, ny = np.add.reduceat(cx, self.starts, axis=1), np.add.reduceat(cy, self.starts, axis=1)
            cells = (np.add.reduceat(special.xlogy(cx, cx), self.starts, axis=1)
                     + np.add.reduceat(special.xlogy(cy, cy), self.starts, axis=1))
            g = 2.0 * (cells - special.xlogy(nx, nx) - special.xlogy(ny, ny) - self._col_term
                       + special.xlogy(nx + ny, nx + ny))
            out[lo:lo + _CHUNK] = np.maximum(g, 0.0).sum(axis=1)
        return out

    def observed(self) -> float:
        mask = np.zeros((1, self.n), dtype=bool)
        mask[0, : self.n_baseline] = True
        return float(self.statistic(mask)[0])

    def random_splits(self, rng: np.random.Generator, count: int) -> np.ndarray:
        base = np.zeros(self.n, dtype=bool)
        base[: self.n_baseline] = True
        return rng.permuted(np.tile(base, (count, 1)), axis=1)

    def all_splits(self, limit: int) -> np.ndarray | None:
        """Every split of the pooled samples into sides of the observed sizes, or None when there are more than
        `limit` (then the test draws `limit` random ones)."""
        if math.comb(self.n, self.n_baseline) > limit:
            return None
        masks = np.zeros((math.comb(self.n, self.n_baseline), self.n), dtype=bool)
        for i, chosen in enumerate(itertools.combinations(range(self.n), self.n_baseline)):
            masks[i, list(chosen)] = True
        return masks

    def p_value(self, observed: float, rng: np.random.Generator, resamples: int, tol: float) -> float:
        """P(summed G >= observed) over every split when they are few, else (b + 1) / (B + 1) over `resamples`
        random splits."""
        exact = self.all_splits(resamples)
        if exact is not None:
            return float(np.mean(self.statistic(exact) >= observed - tol))
        hits = int(np.count_nonzero(self.statistic(self.random_splits(rng, resamples)) >= observed - tol))
        return (hits + 1) / (resamples + 1)
