"""One `compare` as the CLI and the API run it: a baseline log against one candidate log (a run) or several (a
remedy matrix), the recorded temperature noted on the runs, and what the user must be told afterwards (gaps in
the logs, calls paired by request, a pairing that cannot be trusted) returned as lines rather than printed."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from toolaudit import ToolauditError
from toolaudit.compare.logs import CompareOptions, Progress, compare_logs
from toolaudit.compare.scans import Scans
from toolaudit.store import Store


class CompareProblem(ToolauditError):
    """The comparison ran but its pairing cannot be trusted (too few calls paired, or mismatched requests above
    the allowed share); `run_id` is the run it stored."""

    def __init__(self, message: str, run_id: int):
        super().__init__(message)
        self.run_id = run_id


@dataclass(frozen=True)
class CompareJob:
    """What to compare: `candidates` are compared with `baseline` each; `names` label them (empty: the options'
    candidate name for one log, the file names for several). `max_mismatched`: the share of paired calls whose
    two requests may differ before the comparison fails."""

    baseline: str
    candidates: tuple[str, ...]
    options: CompareOptions
    names: tuple[str, ...] = ()
    max_mismatched: float = 0.0


@dataclass
class CompareOutcome:
    """The run written (the matrix's run for several candidates), each candidate's counts, the warnings and
    notes to show, and the problems that make the comparison fail (empty: it did not)."""

    run_id: int
    counts: dict  # candidate name -> compare.logs.RunCounts
    temperature: float | None = None
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def run_compare(store: Store, job: CompareJob, progress: Progress | None = None, scans: Scans | None = None,
                warn: Callable[[str], None] | None = None) -> CompareOutcome:
    """Compare into `store`; the outcome says what to show and whether the pairing holds. `warn` hears, before
    the comparison starts, that the recorded requests sample (the figures then measure sampling noise)."""
    from toolaudit.compare.matrix import compare_matrix, default_names

    options, candidates = job.options, list(job.candidates)
    temperature = recorded_temperature([job.baseline, *candidates], options)
    if temperature and warn is not None:
        warn(sampling_warning(temperature))
    if len(candidates) == 1:
        if job.names:
            options = dataclasses.replace(options, candidate_name=job.names[0])
        run_id, counts = compare_logs(store, job.baseline, candidates[0], options, progress=progress, scans=scans)
        runs = {options.candidate_name: counts}
    else:
        names = list(job.names) or default_names(candidates)
        run_id, per_candidate = compare_matrix(store, job.baseline, candidates, names, options, progress=progress,
                                               scans=scans)
        runs = {name: counts for name, (_, counts) in per_candidate.items()}
    outcome = CompareOutcome(run_id, runs, temperature=temperature)
    if outcome.temperature:
        for rid in [run_id, *(m["run_id"] for m in store.matrix_members(run_id))]:
            store.update_options(rid, {"request_temperature": outcome.temperature})
    _tell(outcome, job, options)
    return outcome


def _tell(outcome: CompareOutcome, job: CompareJob, options: CompareOptions) -> None:
    """The gaps of each log (the baseline's once), calls paired by request, and the pairing problems."""
    from toolaudit.compare.coverage import mismatch_problem, pairing_problem
    from toolaudit.ingest.gaps import gap_warnings

    runs, several = outcome.counts, len(outcome.counts) > 1
    for k, counts in enumerate(runs.values()):
        sides = (("baseline", job.baseline),) if k == 0 else ()
        for side, path in (*sides, ("candidate", job.candidates[k])):
            outcome.warnings += gap_warnings(counts.gaps[side], path, options.session_key, options.customer_key)
    for name, counts in runs.items():
        if counts.pairing.get("by") == "request" and options.pair_by == "auto":
            outcome.notes.append(f"{name + ': ' if several else ''}calls paired by request "
                                 f"({counts.pairing['reason']}); each distinct request is its own session in the "
                                 "store")
        problem = pairing_problem(counts, options.session_key) or mismatch_problem(counts, job.max_mismatched)
        if problem:
            outcome.problems.append(f"{name}: {problem}" if several else problem)


def recorded_temperature(logs: list[str | Path], options: CompareOptions) -> float | None:
    """The highest temperature the logs' first requests asked for (None: greedy). Above 0 each call has one
    sample per side, so a call that differs measures sampling noise, not drift (`sampling_warning`)."""
    from toolaudit.ingest.temperature import recorded_temperature as first_requests

    temps = [t for t in (first_requests(str(log), options.session_key, options.customer_key, options.format)
                         for log in logs) if t]
    return max(temps) if temps else None


def sampling_warning(temperature: float) -> str:
    from toolaudit.ingest.temperature import SCANNED

    return (f"the recorded requests sample (temperature up to {temperature:g} in the first {SCANNED} of a log): "
            "with one answer per call on each side, a call that differs measures sampling noise, not drift; replay "
            "the calls with --samples N (e.g. 16) to test whether the tool-call distribution moved "
            "(docs/statistics.md)")
