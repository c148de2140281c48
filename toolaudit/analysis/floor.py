"""The noise floor beside a candidate's drift: how much of it the candidate did.

The baseline path decoded a second time under another batch composition (`replay --noise-floor`, on by default in
`demo`) drifts against itself wherever low-precision outputs depend on their batch: in bf16 on a CPU the same
greedy path at batch 16 and at batch 1 differed on 7 of 32 demo calls, as often as speculation did. A candidate
replayed in the same run is read beside that floor: its excess over the floor, paired by call (a call the floor
already flips is not the candidate's doing), with an interval on the difference (`stats.paired_difference`).

This module is the excess's one definition (`FloorFigures.excess`) and its one serialization: the nested figures of
`as_dict` (`summary --json`'s `noise_floor`) and the flat keys of every row that carries it (`paired_keys`: a
customer's row, a tool's, a history row, a remedy, a report's `noise_floor`). Its budget is `budgets.Budget`'s, its
rendering `report/floor.py`'s.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from toolaudit.analysis.runs import run_options
from toolaudit.analysis.stats import Difference, Rate, paired_difference, wilson
from toolaudit.store import Store
from toolaudit.store import queries as q


@dataclass(frozen=True)
class FloorFigures:
    """A candidate's drift beside its noise floor, on the calls both matched."""

    floor_run_id: int | None  # None on a row folded from several tools' rows (`tool_floor`)
    floor_path: str | None
    calls: int  # matched in both runs
    candidate: Rate  # the candidate's drift on those calls
    floor: Rate  # the floor's drift on those calls
    excess: Difference  # candidate minus floor, paired by call
    only_candidate: int  # drifted on the candidate, not on the floor: the candidate's doing
    only_floor: int
    both: int
    tool_name: str | None = None  # set on the per-tool figures

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("candidate", "floor"):
            rate = getattr(self, key)
            out[key] = {"drifted_calls": rate.k, "calls": rate.n, "drift_rate": rate.p, "ci_low": rate.low,
                        "ci_high": rate.high, "ci_width": rate.width}
        return out

    def tool_row(self) -> dict[str, Any]:
        """One tool's (or a group's) row: the candidate beside the floor on its calls (`tool_floors`)."""
        return {"tool_name": self.tool_name, "calls": self.calls, "drift_rate": self.candidate.p,
                "floor_drift_rate": self.floor.p, "floor_ci_low": self.floor.low, "floor_ci_high": self.floor.high,
                **paired_keys(self, counts=True)}


def paired_keys(f: FloorFigures | None, counts: bool = False) -> dict[str, Any]:
    """The excess as flat rows carry it, `excess`, `excess_ci_low`, `excess_ci_high` (None without figures), and with
    `counts` the paired counts behind it (`only_candidate`, `only_floor`, `both`)."""
    e = None if f is None else f.excess
    out = {"excess": None if e is None else e.estimate, "excess_ci_low": None if e is None else e.low,
           "excess_ci_high": None if e is None else e.high}
    if counts:
        out.update(only_candidate=None if f is None else f.only_candidate,
                   only_floor=None if f is None else f.only_floor, both=None if f is None else f.both)
    return out


def is_noise_floor(run: dict) -> bool:
    """A run row of the baseline against itself: same path names, or its options say so (`runs.same_decoding`)."""
    name = run.get("baseline_name")
    same = name is not None and name == run.get("candidate_name")
    return same or run_options(run).get("noise_floor") is True


def floor_member(store: Store, run_id: int) -> dict | None:
    """The noise-floor member of the matrix `run_id` belongs to (or is), other than `run_id`; None when there is
    none or `run_id` is itself the floor (a floor is not read beside itself)."""
    run = store.run_row(run_id)
    if run["kind"] != "matrix" and is_noise_floor(run):
        return None
    matrix = run["run_id"] if run["kind"] == "matrix" else run["matrix_id"]
    if matrix is None:
        return None
    return next((m for m in store.matrix_members(matrix) if m["run_id"] != run_id and is_noise_floor(m)), None)


def floor_figures(store: Store, run_id: int, customer: str | None = None,
                  member: dict | None = None) -> FloorFigures | None:
    """`run_id`'s drift beside its matrix's noise floor (None without one, or for the floor run itself). `member`:
    the floor run, when the caller has looked it up already (`floor_member`)."""
    member = member or floor_member(store, run_id)
    if member is None:
        return None
    (t,) = q.paired_drift(store, run_id, member["run_id"], customer)
    return _figures(member, t)


def tool_floors(store: Store, run_id: int, member: dict, fold_unknown_tools: bool = False,
                by_recorded_tool: bool = False) -> list[FloorFigures]:
    """Per tool, the candidate beside the floor on that tool's calls: by the baseline's tool name, or keyed as
    `tool_rows` keys them (`by_recorded_tool`, `fold_unknown_tools`: `queries.paired_drift`)."""
    return [_figures(member, t) for t in q.paired_drift(store, run_id, member["run_id"], by_tool=True,
                                                         fold_unknown_tools=fold_unknown_tools,
                                                         by_recorded_tool=by_recorded_tool)]


def tool_floor(name: str | None, calls: int, only_candidate: int, only_floor: int, both: int) -> FloorFigures:
    """One tool's (or a group of tools') figures from its paired counts, without a floor run to name (a row that
    folds several tools' rows together)."""
    return _figures({"run_id": None, "candidate_name": None},
                    {"tool_name": name, "calls": calls, "only_a": only_candidate, "only_b": only_floor, "both": both})


def _figures(member: dict, t: dict[str, Any]) -> FloorFigures:
    n = t["calls"]
    return FloorFigures(
        floor_run_id=member["run_id"], floor_path=member["candidate_name"], calls=n,
        candidate=wilson(t["both"] + t["only_a"], n), floor=wilson(t["both"] + t["only_b"], n),
        excess=paired_difference(t["only_a"], t["only_b"], n), only_candidate=t["only_a"], only_floor=t["only_b"],
        both=t["both"], tool_name=t.get("tool_name"))
