"""The figures of a sampled run (each call decoded N times per path at temperature > 0), for `summary`, `check`
and reports: which calls' outcome distributions moved (a `distribution_shift`, BH at q = 0.05 over the per-call
tests stored in `sampled_calls`), the run's global test, the power of its N, and the differences users act on
as paired figures with 95% intervals (schema-valid, unparseable and no-tool-call rates, tool choice, argument
values), by tool and by customer. The statistics are `compare/distributions.py`'s; docs/statistics.md explains them.

Truncated and failed samples are left out of every test and rate (`distributions.UNTESTED`) and counted;
calls with fewer than 2 usable samples a side are stored untested (p NULL) and counted as such.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from toolaudit import ToolauditError
from toolaudit.analysis.runs import is_sampled, samples_per_call
from toolaudit.analysis.stats import Rate, wilson
from toolaudit.compare import distributions as dist
from toolaudit.store import Store
from toolaudit.store import sampled_queries as sq
from toolaudit.store.queries import path_rows

SEED = 0  # the global tests' permutations: a summary of the same rows reads the same every time
TOP = 5  # most-shifted calls and argument values shown
POWER_TV = 0.2  # the TV distance `samples_needed` is quoted for
# A slice with no shift is "inconclusive" unless one call's test would see a shift of this TV with 80% power: a
# test that cannot see half a call's outcomes move has not shown that nothing moved (N = 8 a side sees 0.70).
DECIDING_TV = 0.5
SHIFTED, NO_SHIFT, INCONCLUSIVE = "shifted", "no shift detected", "inconclusive"


def verdict(samples_per_call: int, tested: int, shifted: int, global_p: float | None) -> dict[str, Any]:
    """A sampled slice's finding in words (a run, a customer, a tool): `shifted` when a call's test rejects (BH
    q=0.05) or the slice's global test does (p < 0.05); else `no shift detected` when one call's test detects a
    shift of TV >= `DECIDING_TV` with 80% power (saying the smallest TV it detects), else `inconclusive`, with the
    samples per call a decision at that TV needs. Sample 0's drift is never the finding: it is sampling noise."""
    needed = dist.samples_needed(DECIDING_TV)
    tv = dist.power(samples_per_call, max(tested, 1)).per_call_tv
    if tested and (shifted or (global_p is not None and global_p < dist.ALPHA)):
        state = SHIFTED
        text = (f"shifted: {shifted} of {tested} calls' outcome distributions moved" if shifted else
                f"shifted: no single call, but the global test rejects (p = {global_p:.3g})")
    elif tested and tv is not None and tv <= DECIDING_TV:
        state, text = NO_SHIFT, f"no shift detected (this run can detect TV >= {tv:.2f} in a call)"
    else:
        why = "no call has 2 usable samples a side" if not tested else (
            f"a call's test misses shifts under TV {tv:.2f}" if tv is not None else "no TV is detectable")
        state = INCONCLUSIVE
        text = (f"inconclusive: {samples_per_call} samples per call cannot tell ({why}; TV {DECIDING_TV:g} needs "
                f"N = {needed} per call)")
    return {"state": state, "text": text, "detectable_tv": tv, "samples_needed": needed}
LOW_ACCEPTANCE = 0.05  # under this share of proposals accepted, a clean sampled run says little about the sampler
ABSENT = "(absent)"  # an argument a sample's call leaves out: a value of its own

Sample = tuple[str, str, "str | None", "str | None"]  # outcome, outcome_kind, tool_name, arguments (JSON text)


class NotSampled(ToolauditError):
    """A sampled-run figure was asked of a run that decoded one sample per call."""


@dataclass
class _Call:
    row: dict[str, Any]  # the `sampled_calls` row
    baseline: list[Sample]
    candidate: list[Sample]
    shifted: bool = False
    q_value: float | None = None
    left_out: dict[str, dict[str, int]] | None = None  # side -> untested kind -> samples (truncated, failed)

    def sides(self) -> tuple[list[Sample], list[Sample]]:
        return self.baseline, self.candidate

    def outcomes(self) -> tuple[list[str], list[str]]:
        return [s[0] for s in self.baseline], [s[0] for s in self.candidate]


@dataclass
class _Run:
    run: dict
    calls: list[_Call]
    without_test_row: int  # calls with samples but no `sampled_calls` row
    excluded: dict[str, dict[str, int]]  # side -> untested kind -> samples


def _load(store: Store, run_id: int) -> _Run:
    run = store.run_row(run_id)
    if not is_sampled(run):
        raise NotSampled(f"run {run['run_id']} is not a sampled run (one sample per call; replay with --samples N "
                         "at temperature > 0 for distribution tests)")
    rows = sq.sampled_call_rows(store, run["run_id"])
    samples: dict[tuple[str, int], dict[str, list[Sample]]] = {}
    excluded: dict[str, dict[str, int]] = {}
    per_call: dict[tuple[str, int], dict[str, dict[str, int]]] = {}
    for session_id, call_index, side, outcome, kind, tool, args in sq.sample_rows(store, run["run_id"]):
        if kind in dist.UNTESTED or outcome in dist.UNTESTED:
            for into in (excluded, per_call.setdefault((session_id, call_index), {})):
                by_kind = into.setdefault(side, {})
                by_kind[kind] = by_kind.get(kind, 0) + 1
            continue
        samples.setdefault((session_id, call_index), {}).setdefault(side, []).append((outcome, kind, tool, args))
    calls = []
    for row in rows:
        got = samples.pop((row["session_id"], row["call_index"]), {})
        calls.append(_Call(row, got.get("baseline", []), got.get("candidate", []),
                           left_out=per_call.get((row["session_id"], row["call_index"]))))
    q_values = dist.bh_q_values([c.row["p_value"] for c in calls])
    for call, q in zip(calls, q_values):
        call.q_value, call.shifted = q, q is not None and q <= dist.Q
    return _Run(run, calls, len(samples), excluded)


def _shifted_rate(calls: list[_Call]) -> Rate:
    return wilson(sum(c.shifted for c in calls), sum(c.row["p_value"] is not None for c in calls))


def _paired(calls: list[_Call], share: Callable[[list[Sample]], float | None]) -> dist.PairedFigure:
    """A per-call share on both sides, over the calls where both sides have it (e.g. at least one usable sample)."""
    pairs = [(b, c) for b, c in ((share(x), share(y)) for x, y in (call.sides() for call in calls))
             if b is not None and c is not None]
    return dist.paired_share([p[0] for p in pairs], [p[1] for p in pairs])


def _kind_share(kind: str) -> Callable[[list[Sample]], float | None]:
    return lambda side: sum(s[1] == kind for s in side) / len(side) if side else None


def valid_figure(calls: list[_Call]) -> dist.PairedFigure:
    """Schema-valid rate: a call's share of usable samples that are a parsed, schema-valid tool call."""
    return _paired(calls, _kind_share("tool_call"))


@dataclass(frozen=True)
class SampledGate:
    """What `check` needs of a sampled run, without the global tests: shifted calls out of calls tested (Wilson
    interval) and the schema-valid rates paired by call."""

    run_id: int
    shifted: Rate
    valid: dist.PairedFigure

    @property
    def valid_drop(self) -> tuple[float, float, float] | None:
        """baseline - candidate schema-valid rate: (estimate, low, high) of its 95% interval; None without calls."""
        return drop_of(self.valid)


def drop_of(v: dist.PairedFigure) -> tuple[float, float, float] | None:
    """A paired rate's drop, baseline - candidate: (estimate, low, high) of its 95% interval; None without calls."""
    if v.difference is None or v.low is None or v.high is None:
        return None
    return -v.difference, -v.high, -v.low


def sampled_gate(store: Store, run_id: int) -> SampledGate:
    """Raises NotSampled for a run that is not sampled."""
    r = _load(store, run_id)
    return SampledGate(r.run["run_id"], _shifted_rate(r.calls), valid_figure(r.calls))


def _choice(calls: list[_Call], called: Callable[[str | None], bool]) -> dist.PairedFigure:
    """The share of a call's samples whose tool satisfies `called`, over the calls where either side has one."""
    mine = [c for c in calls if any(called(s[2]) for side in c.sides() for s in side)]
    return _paired(mine, lambda side: sum(called(s[2]) for s in side) / len(side) if side else None)


def _tool_choice(calls: list[_Call]) -> list[dict[str, Any]]:
    """Per tool name, the share of a call's samples calling it, over the calls where either side called it.
    `recorded`: whether it is the recorded tool of a call of the run (a name no recorded call used is one a
    decode path chose, often invented by a small model sampling hot)."""
    tools = sorted({s[2] for call in calls for side in call.sides() for s in side if s[2] is not None})
    recorded = _recorded_tools(calls)
    out = [{"tool_name": tool, "recorded": tool in recorded, **_choice(calls, lambda t, x=tool: t == x).as_dict()}
           for tool in tools]
    return sorted(out, key=lambda t: (-t["calls"], t["tool_name"]))


def _recorded_tools(calls: list[_Call]) -> set[str]:
    return {c.row["tool_name"] for c in calls if c.row["tool_name"] is not None}


def _other_tools_choice(calls: list[_Call], choice: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The names no recorded call used (`choice`: `_tool_choice`'s rows), folded: the share of a call's samples
    calling any of them, over the calls where either side did (None when every sampled name is a recorded one's)."""
    names = {t["tool_name"] for t in choice if not t["recorded"]}
    if not names:
        return None
    return {"tools": len(names), **_choice(calls, lambda t: t in names).as_dict()}


def _arg_values(side: list[Sample], tool: str) -> list[dict[str, str]] | None:
    """Each sample of `tool` on this side as {argument: canonical JSON value}, None when it has none."""
    out = []
    for _, _, name, args in side:
        if name == tool and args is not None:
            try:
                value = orjson.loads(args)
            except orjson.JSONDecodeError:
                continue
            if isinstance(value, dict):
                out.append({k: orjson.dumps(v, option=orjson.OPT_SORT_KEYS).decode() for k, v in value.items()})
    return out or None


def _argument_shares(calls: list[_Call], top: int = TOP) -> list[dict[str, Any]]:
    """Per tool, argument and value, the share of a call's samples of that tool giving the argument that value
    (`(absent)`: leaving it out), paired over the calls where both sides called the tool and either gave that
    value. The `top` with the largest |difference|, those whose interval excludes 0 first."""
    per_key: dict[tuple[str, str, str], tuple[list[float], list[float]]] = {}
    for call in calls:
        tools = {s[2] for side in call.sides() for s in side if s[2] is not None}
        for tool in tools:
            b, c = _arg_values(call.baseline, tool), _arg_values(call.candidate, tool)
            if b is None or c is None:
                continue
            for arg in sorted({k for v in b + c for k in v}):
                hb = Counter(v.get(arg, ABSENT) for v in b)
                hc = Counter(v.get(arg, ABSENT) for v in c)
                for value in hb.keys() | hc.keys():
                    shares = per_key.setdefault((tool, arg, value), ([], []))
                    shares[0].append(hb[value] / len(b))
                    shares[1].append(hc[value] / len(c))
    figures = []
    for (tool, arg, value), (b, c) in per_key.items():
        fig = dist.paired_share(b, c)
        if fig.difference:
            figures.append({"tool_name": tool, "argument": arg, "value": value, **fig.as_dict()})

    def rank(f: dict[str, Any]) -> tuple:
        clear = f["low"] > 0 or f["high"] < 0
        return (not clear, -abs(f["difference"]), -f["calls"], f["tool_name"], f["argument"], f["value"])

    return sorted(figures, key=rank)[:top]


def _histogram(outcomes: list[str]) -> list[dict[str, Any]]:
    return [{"outcome": o, "samples": n} for o, n in sorted(Counter(outcomes).items(), key=lambda kv: (-kv[1], kv[0]))]


def _most_shifted(calls: list[_Call], top: int = TOP) -> list[dict[str, Any]]:
    tested = sorted((c for c in calls if c.row["p_value"] is not None),
                    key=lambda c: (c.row["p_value"], -(c.row["tv"] or 0.0), c.row["session_id"], c.row["call_index"]))
    out = []
    for call in tested[:top]:
        b, c = call.outcomes()
        out.append({**{k: call.row[k] for k in ("session_id", "call_index", "customer", "tool_name", "p_value",
                                                "tv", "tv_low", "tv_high", "n_baseline", "n_candidate")},
                    "q_value": call.q_value, "shifted": call.shifted,
                    "baseline": _histogram(b), "candidate": _histogram(c)})
    return out


def _slices(calls: list[_Call], key: str, tests: dict, n: int) -> list[dict[str, Any]]:
    """Per tool (the recorded call's, `sampled_calls.tool_name`; None: it called none) or customer: calls,
    tested, shifted (the run-wide BH verdicts) and the slice's own global test."""
    groups: dict[str, list[_Call]] = {}
    for call in calls:
        groups.setdefault(call.row[key], []).append(call)
    out = []
    for name, members in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0] is None, kv[0] or "")):
        rate = _shifted_rate(members)
        p = tests[(key, name)].p_value
        out.append({key: name, "calls": len(members), "calls_tested": rate.n, "shifted_calls": rate.k,
                    "shifted_share": rate.p if rate.n else None, "global_p": p,
                    "verdict": verdict(n, rate.n, rate.k, p)})
    return out


def _figures(calls: list[_Call], n: int, g: dist.GlobalTest) -> dict[str, Any]:
    """The figures a run and a customer's slice of it share: calls tested and shifted (Wilson), the global test,
    the median TV, the power and the paired rates."""
    rate = _shifted_rate(calls)
    tvs = [c.row["tv"] for c in calls if c.row["p_value"] is not None and c.row["tv"] is not None]
    return {
        "samples_per_call": n,
        "calls": len(calls),
        "calls_tested": rate.n,
        "calls_untested": len(calls) - rate.n,  # fewer than 2 usable samples on a side: p NULL
        "q": dist.Q,
        "shifted_calls": rate.k,
        "shifted_share": rate.p if rate.n else None,
        "shifted_ci_low": rate.low if rate.n else None,
        "shifted_ci_high": rate.high if rate.n else None,
        "global_p": g.p_value,
        "global_statistic": g.statistic,
        "global_calls": g.calls,
        "median_tv": statistics.median(tvs) if tvs else None,
        "power": {**dist.power(n, rate.n).as_dict(), "tv": POWER_TV,
                  "samples_needed_per_call": dist.samples_needed(POWER_TV)},
        "verdict": verdict(n, rate.n, rate.k, g.p_value),
        "paired": {"schema_valid_rate": valid_figure(calls).as_dict(),
                   "unparseable_rate": _paired(calls, _kind_share("unparseable")).as_dict(),
                   "no_tool_call_rate": _paired(calls, _kind_share("no_tool_call")).as_dict()},
    }


def sampled_summary(store: Store, run_id: int) -> dict[str, Any]:
    """A sampled run's figures as plain data (`summary --json`'s `sampled`). Raises NotSampled."""
    r = _load(store, run_id)
    n = samples_per_call(r.run)
    calls = r.calls
    groups = [("run", ("tool_name", c.row["tool_name"]), ("customer", c.row["customer"])) for c in calls]
    tests = dist.global_tests([c.outcomes() for c in calls], groups, SEED)
    g = tests.get("run", dist.GlobalTest(0.0, None, 0))
    figures = _figures(calls, n, g)
    tested = figures["calls_tested"]
    choice = _tool_choice(calls)
    figures["power"]["samples_needed_run"] = dist.samples_needed(POWER_TV, tested) if tested else None
    return {
        "run_id": r.run["run_id"],
        **figures,
        "calls_without_test_row": r.without_test_row,
        "samples_left_out": r.excluded,
        "candidate_acceptance": candidate_acceptance(store, run_id),
        "tool_choice": choice,
        "other_tools_choice": _other_tools_choice(calls, choice),
        "argument_values": _argument_shares(calls),
        "most_shifted": _most_shifted(calls),
        "tools": _slices(calls, "tool_name", tests, n),
        "customers": _slices(calls, "customer", tests, n),
        "shifted_sql": sq.shifted_calls_sql(r.run["run_id"]),
    }


def candidate_acceptance(store: Store, run_id: int) -> dict[str, Any] | None:
    """The candidate's proposals over every sample of the run: drafted, accepted, their rate and whether it is under
    `LOW_ACCEPTANCE`. A defect of a speculative sampler (its verification, its draft's temperature) reaches the
    output only through accepted proposals: behind a draft that is almost always rejected the output is the
    target's own residual distribution, and finding no shift says little about the sampler (docs/statistics.md,
    power on the broken samplers). None for a candidate that proposed nothing (no speculation, or recorded logs)."""
    rows = [r for r in path_rows(store, run_id) if r["side"] == "candidate" and r["drafted_tokens"]]
    if not rows:
        return None
    drafted, accepted = int(rows[0]["drafted_tokens"]), int(rows[0]["accepted_tokens"] or 0)
    rate = accepted / drafted
    return {"drafted": drafted, "accepted": accepted, "rate": rate, "low": rate < LOW_ACCEPTANCE}


def _left_out(calls: list[_Call]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for call in calls:
        for side, kinds in (call.left_out or {}).items():
            for kind, n in kinds.items():
                out.setdefault(side, {})[kind] = out.setdefault(side, {}).get(kind, 0) + n
    return out


def customer_sampled(store: Store, run_id: int, customer: str, top: int = TOP) -> dict[str, Any] | None:
    """One customer's figures of a sampled run, for its report: only that customer's calls (`sampled_calls.customer`,
    '(none)' for calls without one). Shifted calls are the run-wide BH verdicts (q over every call of the run, as
    `summary` and `check` count them) restricted to the customer's calls; the global test, the power, the paired
    figures and the most-shifted calls (lowest p, up to `top`, with both outcome histograms) are computed from the
    customer's calls alone, so its global p is `global_test` on them (the `summary` customer row draws its
    permutations beside other customers' calls: the two agree up to Monte Carlo error). None when the customer has
    no sampled call in the run. Raises NotSampled for a run that is not sampled."""
    r = _load(store, run_id)
    calls = [c for c in r.calls if c.row["customer"] == customer]
    if not calls:
        return None
    n = samples_per_call(r.run)
    g = dist.global_test([c.outcomes() for c in calls], SEED)
    return {
        "run_id": r.run["run_id"],
        "customer": customer,
        **_figures(calls, n, g),
        "samples_left_out": _left_out(calls),
        "most_shifted": _most_shifted(calls, top),
    }


@dataclass(frozen=True)
class SampledSlice:
    """A sampled run's figures on one slice of its calls (all of them, or one customer's), for `frontier`: shifted
    calls (the run-wide BH verdicts on the slice's calls) of those tested with the Wilson interval, the slice's own
    global test, the median TV of its tested calls and the schema-valid rates paired by call."""

    run_id: int
    customer: str | None
    samples_per_call: int
    calls: int
    shifted: Rate
    global_p: float | None
    median_tv: float | None
    valid: dist.PairedFigure

    @property
    def valid_drop(self) -> tuple[float, float, float] | None:
        return drop_of(self.valid)

    def as_dict(self) -> dict[str, Any]:
        drop = self.valid_drop
        return {"samples_per_call": self.samples_per_call, "calls": self.calls, "calls_tested": self.shifted.n,
                "shifted_calls": self.shifted.k, "shifted_share": self.shifted.p if self.shifted.n else None,
                "shifted_ci_low": self.shifted.low if self.shifted.n else None,
                "shifted_ci_high": self.shifted.high if self.shifted.n else None, "global_p": self.global_p,
                "median_tv": self.median_tv, "valid_drop": None if drop is None else drop[0],
                "valid_drop_ci_low": None if drop is None else drop[1],
                "valid_drop_ci_high": None if drop is None else drop[2]}


def sampled_slices(store: Store, run_id: int, customers: list[str | None]) -> dict[str | None, SampledSlice]:
    """`SampledSlice` of a sampled run for each of `customers` (None: every call), from one read of its samples. A
    customer without sampled calls gets a slice of 0 calls. Raises NotSampled."""
    r = _load(store, run_id)
    n = samples_per_call(r.run)
    out = {}
    for customer in customers:
        calls = [c for c in r.calls if customer is None or c.row["customer"] == customer]
        tvs = [c.row["tv"] for c in calls if c.row["p_value"] is not None and c.row["tv"] is not None]
        g = dist.global_test([c.outcomes() for c in calls], SEED) if calls else dist.GlobalTest(0.0, None, 0)
        out[customer] = SampledSlice(r.run["run_id"], customer, n, len(calls), _shifted_rate(calls), g.p_value,
                                     statistics.median(tvs) if tvs else None, valid_figure(calls))
    return out
