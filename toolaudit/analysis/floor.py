"""The noise floor beside a candidate's drift: how much of it the candidate did.

The baseline path decoded a second time under another batch composition (`replay --noise-floor`, on by default in
`demo`) drifts against itself wherever low-precision outputs depend on their batch: in bf16 on a CPU the same
greedy path at batch 16 and at batch 1 differed on 20 of 90 demo calls, more than speculation did. A candidate
replayed in the same run is read beside that floor: its excess over the floor, paired by call (a call the floor
already flips is not the candidate's doing), with an interval on the difference (`stats.paired_difference`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import orjson

from toolaudit.analysis.stats import Difference, Rate, paired_difference, wilson
from toolaudit.store import Store
from toolaudit.store import queries as q


@dataclass(frozen=True)
class FloorFigures:
    """A candidate's drift beside its noise floor, on the calls both matched."""

    floor_run_id: int
    floor_path: str
    calls: int  # matched in both runs
    candidate: Rate  # the candidate's drift on those calls
    floor: Rate  # the floor's drift on those calls
    excess: Difference  # candidate minus floor, paired by call
    only_candidate: int  # drifted on the candidate, not on the floor: the candidate's doing
    only_floor: int
    both: int

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("candidate", "floor"):
            rate = getattr(self, key)
            out[key] = {"drifted_calls": rate.k, "calls": rate.n, "drift_rate": rate.p, "ci_low": rate.low,
                        "ci_high": rate.high}
        return out


def floor_run(store: Store, run_id: int) -> dict | None:
    """The noise-floor member of the matrix `run_id` belongs to (or is), other than `run_id` itself."""
    run = store.run_row(run_id)
    matrix = run["run_id"] if run["kind"] == "matrix" else run["matrix_id"]
    if matrix is None:
        return None
    for member in store.matrix_members(matrix):
        options = orjson.loads(member["options"]) if member["options"] else {}
        if member["run_id"] != run_id and options.get("noise_floor") is True:
            return member
    return None


def is_floor(store: Store, run_id: int) -> bool:
    run = store.run_row(run_id)
    return bool(run["options"]) and orjson.loads(run["options"]).get("noise_floor") is True


def floor_figures(store: Store, run_id: int, customer: str | None = None) -> FloorFigures | None:
    """`run_id`'s drift beside its matrix's noise floor (None without one, or for the floor run itself)."""
    if is_floor(store, run_id):
        return None
    member = floor_run(store, run_id)
    if member is None:
        return None
    t = q.paired_drift(store, run_id, member["run_id"], customer)
    n = t["calls"]
    return FloorFigures(
        floor_run_id=member["run_id"], floor_path=member["candidate_name"], calls=n,
        candidate=wilson(t["both"] + t["only_a"], n), floor=wilson(t["both"] + t["only_b"], n),
        excess=paired_difference(t["only_a"], t["only_b"], n), only_candidate=t["only_a"], only_floor=t["only_b"],
        both=t["both"])


def customer_floors(store: Store, run_id: int) -> dict[str, FloorFigures]:
    """Per customer, the candidate beside the floor on that customer's calls only."""
    out = {}
    for customer in q.customer_names(store, run_id):
        figures = floor_figures(store, run_id, customer)
        if figures is not None:
            out[customer] = figures
    return out


def tool_floors(store: Store, run_id: int) -> list[dict[str, Any]]:
    """Per tool, the candidate's drift, the floor's and the excess paired by call (empty without a floor)."""
    if is_floor(store, run_id):
        return []
    member = floor_run(store, run_id)
    if member is None:
        return []
    out = []
    for t in q.paired_drift_by_tool(store, run_id, member["run_id"]):
        n = t["calls"]
        candidate, floor = wilson(t["both"] + t["only_a"], n), wilson(t["both"] + t["only_b"], n)
        excess = paired_difference(t["only_a"], t["only_b"], n)
        out.append({"tool_name": t["tool_name"], "calls": n, "drift_rate": candidate.p,
                    "floor_drift_rate": floor.p, "floor_ci_low": floor.low, "floor_ci_high": floor.high,
                    "excess": excess.estimate, "excess_ci_low": excess.low, "excess_ci_high": excess.high,
                    "only_candidate": t["only_a"], "only_floor": t["only_b"], "both": t["both"]})
    return out
