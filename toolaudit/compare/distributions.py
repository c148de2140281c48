"""Statistics of sampled replays: is a call's tool-call *distribution* the same on the candidate path?

At temperature > 0 speculative decoding promises the target's output distribution, not its output, so one sample
against one sample measures sampling noise. A sampled replay decodes each call N times per path; here:

- `call_test`: per call, an exact two-sample permutation test of the two outcome distributions (the G statistic
  of the 2 x K table of side by outcome) and the total-variation distance with a 95% bootstrap interval;
- `global_test`: per run (or slice), the summed G against its permutation null, labels permuted within each call;
- `shifted`: the calls whose distributions moved (a `distribution_shift`), Benjamini-Hochberg at q = 0.05;
- `paired_share`: a per-call share (schema-valid, a tool's choice...) on both sides, paired by call: the mean
  difference with a 95% interval across calls;
- `power` and `samples_needed`: the smallest TV distance a run's N detects, and the N a given TV needs.

Pure: outcome strings in, figures out, no store. The library is scipy.stats (permutation_test, bootstrap,
false_discovery_control, ttest_1samp, chi2/ncx2); docs/statistics.md states the assumptions.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from scipy import optimize, special, stats

from toolaudit.compare.projections import Projections

# Sample outcomes the tests leave out: a sample cut at max_tokens or one the engine failed says nothing about the
# path's tool-call distribution (the budget or the engine decided it). Counted by the callers, never compared.
UNTESTED = frozenset({"truncated", "error"})
ALPHA = 0.05
Q = 0.05  # BH false discovery rate of `shifted` (the `sampled_call_shifts` view uses the same)
_REL_TOL = 1e-9  # a null statistic within this relative distance of the observed one counts as >= (float ties)
_MAX_TABLES = 20_000  # the largest exact null enumerated (`call_test` uses it up to `resamples` tables)
_SMALL_NULL = 2_000  # exact nulls up to this many tables are cached by the thousand, larger ones by the dozen


def tested(outcomes: Iterable[str]) -> list[str]:
    """The outcomes a test compares: every sample but the truncated and failed ones (`UNTESTED`)."""
    return [o for o in outcomes if o not in UNTESTED]


@dataclass(frozen=True)
class CallTest:
    """One call's two-sample test: `statistic` is G (None when a side has no sample), `p_value` the permutation
    p-value (None when a side has fewer than 2 samples), `tv` the total-variation distance of the two empirical
    distributions with its 95% bootstrap interval (`tv_low`, `tv_high`; None when a side has fewer than 2)."""

    n_baseline: int
    n_candidate: int
    outcomes: int
    statistic: float | None
    p_value: float | None
    tv: float | None
    tv_low: float | None
    tv_high: float | None

    def as_row(self) -> dict[str, Any]:
        """The figures as `sampled_calls` columns (the caller adds run_id, session_id, call_index, customer and
        tool_name)."""
        return asdict(self)


@dataclass(frozen=True)
class GlobalTest:
    """The summed per-call G of `calls` tested calls against its permutation null (p = (b + 1) / (B + 1))."""

    statistic: float
    p_value: float | None
    calls: int


def _codes(baseline: Sequence[str], candidate: Sequence[str]) -> tuple[np.ndarray, np.ndarray, int]:
    """Both sides as integer codes of the sorted distinct outcomes (deterministic whatever the input order)."""
    index = {o: i for i, o in enumerate(sorted(set(baseline) | set(candidate)))}
    x = np.fromiter((index[o] for o in baseline), dtype=np.int64, count=len(baseline))
    y = np.fromiter((index[o] for o in candidate), dtype=np.int64, count=len(candidate))
    return x, y, len(index)


def _counts(codes: np.ndarray, k: int) -> np.ndarray:
    """Counts of each code 0..k-1 along the last axis: shape (..., n) -> (..., k), one bincount for all rows."""
    lead, n = codes.shape[:-1], codes.shape[-1]
    rows = int(np.prod(lead, dtype=np.int64))
    flat = codes.reshape(rows, n) + (k * np.arange(rows, dtype=np.int64))[:, None]
    return np.bincount(flat.ravel(), minlength=rows * k).reshape(*lead, k)


def _g(cx: np.ndarray, cy: np.ndarray) -> np.ndarray:
    """G = 2 sum O ln(O / E) of the 2 x K tables whose rows are `cx` and `cy` (counts on the last axis), written
    with xlogy so empty cells need no special case."""
    col = cx + cy
    nx, ny = cx.sum(axis=-1), cy.sum(axis=-1)
    n = nx + ny
    cells = special.xlogy(cx, cx).sum(axis=-1) + special.xlogy(cy, cy).sum(axis=-1)
    margins = special.xlogy(nx, nx) + special.xlogy(ny, ny) + special.xlogy(col, col).sum(axis=-1)
    return np.maximum(2.0 * (cells - margins + special.xlogy(n, n)), 0.0)


def _tv(cx: np.ndarray, cy: np.ndarray) -> np.ndarray:
    return 0.5 * np.abs(cx / cx.sum(axis=-1, keepdims=True) - cy / cy.sum(axis=-1, keepdims=True)).sum(axis=-1)


def call_test(baseline: Sequence[str], candidate: Sequence[str], seed: int, resamples: int = 9999,
              *, interval_resamples: int = 1999) -> CallTest:
    """Exact two-sample test of one call's outcome distributions, and their total-variation distance.

    The statistic is G, the likelihood-ratio statistic of the 2 x K table (side by outcome). G rather than
    Pearson's chi-square because it is the log-likelihood ratio of "one distribution" against "two": it adds up
    over independent calls into the run's likelihood ratio, which is what `global_test` sums. Its chi-square
    approximation is never used (small N, sparse tables): the p-value is the permutation test's, P(G >= observed)
    when the pooled samples are split at random into sides of the observed sizes.

    G depends on a split only through its table, and a uniform random split gives the baseline's row the
    multivariate hypergeometric distribution given the outcome totals; so when the tables with these margins
    number no more than `resamples` (and 20,000; every call with up to 5 outcomes at N = 16 a side: at most
    1,786) the p-value is computed exactly over them, with `scipy.stats.multivariate_hypergeom` probabilities
    (the number `scipy.stats.permutation_test` gives by enumerating the splits, where it can: a test checks it).
    Otherwise it is `scipy.stats.permutation_test`'s (independent samples, `resamples` random splits, p =
    (b + 1) / (B + 1)). Enumerating splits instead would be exact only up to N = 7 a side, and scipy draws
    random splits in a Python loop (about 0.1 s per call at 9,999).

    TV is 1/2 sum |p_baseline - p_candidate| of the empirical distributions; its 95% interval is BCa
    (`scipy.stats.bootstrap`, each side resampled on its own), falling back to the percentile interval, then to
    the point, when the bootstrap distribution is degenerate. The empirical TV is biased upward (two samples of
    one distribution rarely match exactly), so read a small TV through the p-value, not the interval.
    Identical single-outcome sides: G = 0, p = 1, TV = 0, interval [0, 0]. Deterministic per seed."""
    x, y, k = _codes(baseline, candidate)
    nx, ny = len(x), len(y)
    if nx == 0 or ny == 0:
        return CallTest(nx, ny, k, None, None, None, None, None)
    cx, cy = _counts(x, k), _counts(y, k)
    g, tv = float(_g(cx, cy)), float(_tv(cx, cy))
    small = nx < 2 or ny < 2
    if k == 1:
        return CallTest(nx, ny, k, 0.0, None if small else 1.0, 0.0, None if small else 0.0, None if small else 0.0)
    if small:
        return CallTest(nx, ny, k, g, None, tv, None, None)
    rng = np.random.default_rng(seed)
    projected = Projections(baseline, candidate)
    if projected.useful:  # tool calls with readable arguments: the summed G of every projection (projections.py)
        g = projected.observed()
        p = projected.p_value(g, rng, resamples, _REL_TOL * max(1.0, g))
        low, high = _tv_interval(x, y, k, tv, rng, interval_resamples)
        return CallTest(nx, ny, k, g, min(1.0, p), tv, low, high)
    null = _exact_null(cx + cy, nx, limit=resamples)
    if null is not None:
        values, probs, _ = null
        p = float(probs[values >= g - _REL_TOL * max(1.0, g)].sum())
    else:
        def g_stat(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
            return _g(_counts(np.moveaxis(a, axis, -1), k), _counts(np.moveaxis(b, axis, -1), k))

        p = float(stats.permutation_test((x, y), g_stat, permutation_type="independent", vectorized=True,
                                         n_resamples=resamples, alternative="greater", rng=rng).pvalue)
    low, high = _tv_interval(x, y, k, tv, rng, interval_resamples)
    return CallTest(nx, ny, k, g, min(1.0, p), tv, low, high)


def table_count(totals: Sequence[int], n: int) -> int:
    """How many distinct tables the permutation null of G has for these outcome totals and n baseline samples:
    baseline rows (a_1..a_K, 0 <= a_j <= totals_j, sum n), with the outcomes seen once pooled (`_exact_null`).
    `call_test` is exact when this is at most its `resamples`."""
    multi = [int(t) for t in totals if t > 1]
    singles = sum(1 for t in totals if t == 1)
    return _count(multi + ([singles] if singles else []), n)


def _count(col: Sequence[int], n: int) -> int:
    ways = np.zeros(n + 1, dtype=object)
    ways[0] = 1
    for t in col:
        ways = np.convolve(ways, np.ones(int(t) + 1, dtype=object))[: n + 1]
    return int(ways[n])


def _exact_null(totals: Sequence[int], n: int, limit: int = _MAX_TABLES
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The exact permutation null of G for these outcome totals and n baseline samples: the G of every table
    that can arise, its probability and their cumulative sum; None when there are more than `limit` (at most
    `_MAX_TABLES`).

    Outcomes seen once in the call (free text makes many) add xlogy(1, 1) = 0 to G on whichever side they
    fall, so they are pooled into one column whose split only carries probability: exact, and a call whose 2N
    samples are all different has one table (G is the same for every split, p = 1)."""
    multi = tuple(sorted(int(t) for t in totals if t > 1))
    key = (multi, sum(1 for t in totals if t == 1), n)
    count = _key_count(*key)
    if count > min(limit, _MAX_TABLES):
        return None
    return _small_null(*key) if count <= _SMALL_NULL else _large_null(*key)


@lru_cache(maxsize=16384)
def _key_count(multi: tuple[int, ...], singles: int, n: int) -> int:
    return _count(multi + ((singles,) if singles else ()), n)


def clear_caches() -> None:
    """Forget the exact nulls built so far (benchmarks measure a fresh process with it)."""
    for cached in (_key_count, _small_null, _large_null):
        cached.cache_clear()


def _null_of(multi: tuple[int, ...], singles: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`_exact_null` by its cache key (outcome totals over 1, sorted, and how many are 1). Cached in two sizes
    (`_small_null`, `_large_null`) so that memory stays bounded (about 100 MB at worst): calls share margins
    (15 of one outcome and 1 of another...), and `call_test` and `global_tests` share the caches."""
    col = np.asarray(multi + ((singles,) if singles else ()), dtype=np.int64)
    rest = np.concatenate([np.cumsum(col[::-1])[::-1][1:], [0]])  # capacity of the columns after each
    rows, sums = np.zeros((1, 0), dtype=np.int64), np.zeros(1, dtype=np.int64)
    for j, c in enumerate(col):
        lo, hi = np.maximum(0, n - sums - rest[j]), np.minimum(c, n - sums)
        width = hi - lo + 1
        parent = np.repeat(np.arange(len(rows)), width)
        offset = np.arange(parent.size) - np.repeat(np.cumsum(width) - width, width)
        a = lo[parent] + offset
        rows, sums = np.column_stack([rows[parent], a]), sums[parent] + a
    probs = stats.multivariate_hypergeom.pmf(rows, m=col, n=n)
    probs = probs / probs.sum()
    m, total = len(multi), int(col.sum())
    a, b = rows[:, :m], col[:m] - rows[:, :m]  # the pooled singles' cells add 0
    cells = special.xlogy(a, a).sum(axis=1) + special.xlogy(b, b).sum(axis=1)
    margins = (special.xlogy(n, n) + special.xlogy(total - n, total - n) + special.xlogy(col[:m], col[:m]).sum()
               - special.xlogy(total, total))
    return np.maximum(2.0 * (cells - margins), 0.0), probs, np.cumsum(probs)


_small_null = lru_cache(maxsize=2048)(_null_of)  # up to _SMALL_NULL tables: most calls
_large_null = lru_cache(maxsize=64)(_null_of)


def _tv_interval(x: np.ndarray, y: np.ndarray, k: int, tv: float, rng: np.random.Generator,
                 resamples: int) -> tuple[float, float]:
    def tv_stat(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
        return _tv(_counts(np.moveaxis(a, axis, -1), k), _counts(np.moveaxis(b, axis, -1), k))

    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DegenerateDataWarning, invalid values of a constant jackknife
            ci = stats.bootstrap((x, y), tv_stat, vectorized=True, n_resamples=resamples, method=method,
                                 rng=rng).confidence_interval
        low, high = float(ci.low), float(ci.high)
        if math.isfinite(low) and math.isfinite(high):
            return max(0.0, min(low, tv)), min(1.0, max(high, tv))
    return tv, tv  # every resample gave the same TV (e.g. two disjoint single outcomes: TV 1)


def global_test(calls: Sequence[tuple[Sequence[str], Sequence[str]]], seed: int,
                resamples: int = 1999) -> GlobalTest:
    """The summed per-call G against its permutation null: in each of `resamples` resamples every call's
    baseline/candidate labels are permuted within that call (stratified: calls never mix), and the sums are
    compared with the observed one; p = (b + 1) / (B + 1), b the resamples at least as large.

    A random relabelling of a call changes G only through the call's table, so each call's permuted G is drawn
    from its exact permutation null (`_exact_null`, inverse CDF) or, for calls with too many tables, from tables
    drawn by numpy's multivariate hypergeometric sampler (the table a random relabelling gives): one vector of
    `resamples` draws per call, summed over calls. Calls with fewer than 2 samples on a side are left out (not
    counted in `calls`), as `call_test` leaves them untested; calls with one outcome on both sides count but add
    0 to every sum. Deterministic per seed."""
    return global_tests(calls, [("all",)] * len(calls), seed, resamples)["all"]


def global_tests(calls: Sequence[tuple[Sequence[str], Sequence[str]]], groups: Sequence[Sequence[Hashable]],
                 seed: int, resamples: int = 1999) -> dict[Hashable, GlobalTest]:
    """`global_test` for several sets of calls at once (the run, each tool, each customer): `groups[i]` names the
    sets call i belongs to. Each call's permuted statistics are drawn once and added to every set it is in, so
    a set's p-value is the one `global_test` gives on its calls alone with the same draws (the run's is the
    same whatever the groups). Sets with no call tested have p None."""
    rng = np.random.default_rng(seed)
    null: dict[Hashable, np.ndarray] = {}
    observed: dict[Hashable, float] = {}
    used: dict[Hashable, int] = {}
    for (baseline, candidate), keys in zip(calls, groups):
        for key in keys:
            null.setdefault(key, np.zeros(resamples))
            observed.setdefault(key, 0.0)
            used.setdefault(key, 0)
        x, y, k = _codes(baseline, candidate)
        if len(x) < 2 or len(y) < 2:
            continue
        for key in keys:
            used[key] += 1
        if k == 1:
            continue
        projected = Projections(baseline, candidate)
        if projected.useful:
            g = projected.observed()
            draws = projected.statistic(projected.random_splits(rng, resamples))
            for key in keys:
                observed[key] += g
                null[key] += draws
            continue
        cx, cy = _counts(x, k), _counts(y, k)
        g = float(_g(cx, cy))
        totals = cx + cy
        exact = _exact_null(totals, len(x))
        if exact is not None:
            values, _, cdf = exact
            draws = values[np.minimum(np.searchsorted(cdf, rng.random(resamples), side="right"), len(values) - 1)]
        else:
            drawn = rng.multivariate_hypergeometric(totals, len(x), size=resamples)
            draws = _g(drawn, totals - drawn)
        for key in keys:
            observed[key] += g
            null[key] += draws
    out = {}
    for key, sums in null.items():
        if used[key] == 0:
            out[key] = GlobalTest(0.0, None, 0)
            continue
        hits = int(np.count_nonzero(sums >= observed[key] - _REL_TOL * max(1.0, observed[key])))
        out[key] = GlobalTest(observed[key], (hits + 1) / (resamples + 1), used[key])
    return out


def shifted(p_values: Sequence[float | None], q: float = Q) -> list[bool]:
    """Which calls shifted: Benjamini-Hochberg (`scipy.stats.false_discovery_control`) at false discovery rate
    `q` over the calls with a p-value; a call without one (too few samples) is not tested and not shifted."""
    q_values = bh_q_values(p_values)
    return [v is not None and v <= q for v in q_values]


def bh_q_values(p_values: Sequence[float | None]) -> list[float | None]:
    """BH-adjusted p-values (as the `sampled_call_shifts` view's `q_value`), None where the p-value is None."""
    idx = [i for i, p in enumerate(p_values) if p is not None]
    out: list[float | None] = [None] * len(p_values)
    if idx:
        adjusted = stats.false_discovery_control(np.array([p_values[i] for i in idx], dtype=float), method="bh")
        for i, v in zip(idx, adjusted):
            out[i] = float(v)
    return out


@dataclass(frozen=True)
class PairedFigure:
    """A per-call share on both sides averaged over `calls` calls (each call weighs the same), and
    `difference` = candidate - baseline with its 95% interval across calls. None when no call has both sides."""

    baseline: float | None
    candidate: float | None
    difference: float | None
    low: float | None
    high: float | None
    calls: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def paired_share(baseline_shares: Sequence[float], candidate_shares: Sequence[float]) -> PairedFigure:
    """Per-call shares (a call's schema-valid share among its samples, say) paired by call: the mean difference
    (candidate - baseline) with the 95% t interval of the per-call differences (`ttest_1samp(...)
    .confidence_interval`; the calls are the unit, so the interval speaks for the traffic the calls were drawn
    from). All differences equal: a zero-width interval; one call: nothing is known of the spread, [-1, 1]."""
    b = np.asarray(baseline_shares, dtype=float)
    c = np.asarray(candidate_shares, dtype=float)
    if b.shape != c.shape:
        raise ValueError(f"paired shares differ in length: {b.size} baseline, {c.size} candidate")
    n = int(b.size)
    if n == 0:
        return PairedFigure(None, None, None, None, None, 0)
    d = c - b
    mean = float(d.mean())
    if n == 1:
        low, high = -1.0, 1.0
    elif np.ptp(d) <= 1e-12:  # all equal but for rounding: the t interval would be NaN or noise
        low = high = mean
    else:
        ci = stats.ttest_1samp(d, 0.0).confidence_interval(0.95)
        low, high = max(-1.0, float(ci.low)), min(1.0, float(ci.high))
    return PairedFigure(float(b.mean()), float(c.mean()), mean, low, high, n)


@dataclass(frozen=True)
class Power:
    """The smallest TV distance detected with the asked power: by one call's test at alpha (`per_call_tv`), and by
    the run's global test when every call shifts by that much (`run_tv`); None where even TV 1 is not."""

    per_call_tv: float | None
    run_tv: float | None
    n_per_side: int
    calls: int
    alpha: float
    power: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _noncentrality(df: int, alpha: float, power: float) -> float:
    """The noncentrality at which a chi-square test with `df` degrees of freedom at level alpha has this power."""
    crit = stats.chi2.isf(alpha, df)

    def short(lam: float) -> float:
        return float(stats.ncx2.sf(crit, df, lam)) - power

    hi = 1.0
    while short(hi) < 0:
        hi *= 2
    return float(optimize.brentq(short, 1e-9, hi, xtol=1e-10))


def power(n_per_side: int, calls: int, alpha: float = ALPHA, power: float = 0.8) -> Power:
    """The smallest TV distance detected with probability `power`.

    Approximation: the 2 x 2 table (two outcomes) in its worst case, both probabilities near 1/2, where a TV
    shift of d between samples of N a side gives a chi-square statistic with noncentrality lambda = 2 N d^2 (the
    two-proportion test's (p1 - p2)^2 / (p(1-p) 2/N) at p = 1/2); one degree of freedom per call, `calls` for the
    run (the summed statistic, every call shifted by d). The permutation tests are exact where this is not; more
    outcomes per call spread the same TV over more degrees of freedom and need somewhat more."""
    if n_per_side < 1:
        return Power(None, None, n_per_side, calls, alpha, power)

    def tv_at(df: int) -> float | None:
        d = math.sqrt(_noncentrality(df, alpha, power) / (2 * n_per_side * df))
        return d if d <= 1.0 else None

    return Power(tv_at(1), tv_at(calls) if calls >= 1 else None, n_per_side, calls, alpha, power)


def samples_needed(tv: float, calls: int = 1, alpha: float = ALPHA, power: float = 0.8) -> int:
    """Samples per side and call that detect a TV shift of `tv` (in every one of `calls` calls) with this power,
    by the approximation of `power()` (N = lambda / (2 calls tv^2), at least 2)."""
    if not 0 < tv <= 1:
        raise ValueError(f"tv must be in (0, 1], got {tv}")
    if calls < 1:
        raise ValueError(f"calls must be at least 1, got {calls}")
    return max(2, math.ceil(_noncentrality(calls, alpha, power) / (2 * calls * tv * tv) - 1e-9))
