"""The Python API: what the CLI does, for notebooks and CI scripts (docs/api.md).

    import toolaudit
    run = toolaudit.compare("baseline.jsonl", "candidate.jsonl", db="audit.duckdb")
    s = run.summary()                      # typed: s.drift.p, s.noise_floor, s.speed.speedup, s.as_dict()
    calls = run.calls().df()               # a DuckDB relation: .df() (pandas), .arrow(), .fetchall()
    with toolaudit.open("audit.duckdb") as db:
        for r in db.runs(): print(r.run_id, r.name, r.summary().drift)

The CLI's commands call the same library functions (`compare.logs.compare_logs`, `replay.replayer.
replay_traces`, `analysis.figures.run_summary`); every figure here is the one `--json` prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolaudit.analysis.floor import FloorFigures
from toolaudit.analysis.speed import Speed
from toolaudit.analysis.stats import Rate, wilson
from toolaudit.store import Store
from toolaudit.store import queries as q


@dataclass(frozen=True)
class Summary:
    """A run's headline figures (`toolaudit summary --json`), typed; `as_dict()` has every figure."""

    run_id: int
    name: str | None
    status: str
    baseline: str
    candidate: str
    drift: Rate  # drifted of compared calls, with its 95% Wilson interval
    speed: Speed  # tokens/s of both paths, the speedup and the candidate's acceptance (None for recorded logs)
    noise_floor: FloorFigures | None  # the candidate beside its noise floor, paired by call (`--noise-floor` runs)
    calls_per_session_replayed: float
    calls_per_session_recorded: float | None
    sampled: dict[str, Any] | None  # a sampled run's distribution figures, with its verdict in words
    figures: dict[str, Any] = field(repr=False, default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.figures)


@dataclass(frozen=True)
class Run:
    """One run in a database: its row, and what the CLI shows of it."""

    db: Database
    run_id: int
    name: str | None
    kind: str
    status: str
    baseline: str
    candidate: str

    def summary(self) -> Summary:
        from toolaudit.analysis.figures import run_summary
        from toolaudit.analysis.floor import floor_figures
        from toolaudit.analysis.speed import speed

        store = self.db.store
        s = run_summary(store, self.run_id)
        floor = floor_figures(store, self.run_id) if s["noise_floor"] else None  # as `summary --json` has it
        return Summary(s["run_id"], s["run_name"], s["status"], s["baseline"], s["candidate"],
                       wilson(s["drifted_calls"], s["calls"]), speed(store, self.run_id), floor,
                       s["calls_per_session_replayed"], s["calls_per_session_recorded"], s["sampled"], s)

    def calls(self):
        """The run's calls (one row per call, `docs/schema.md`) as a DuckDB relation."""
        return q.calls_relation(self.db.store, self.run_id)

    def frontier(self, **budget: Any):
        """The run's candidates side by side (its matrix's, for a member), as `toolaudit frontier`, judged by the
        budget given as `analysis.budgets.Budget`'s fields (`max_call_drift=0.015`, `rule=...`)."""
        from toolaudit.analysis.budgets import Budget
        from toolaudit.analysis.frontier import frontier

        return frontier(self.db.store, self.run_id, None, Budget(**budget))


class Database:
    """A toolaudit database opened for reading (`toolaudit.open`); a context manager."""

    def __init__(self, path: str | Path, read_only: bool = True):
        self.path = str(path)
        self.store = Store(path, read_only=read_only)

    def runs(self) -> list[Run]:
        return [self._run(r) for r in q.run_rows(self.store)]

    def run(self, ref: int | str | None = None) -> Run:
        """A run by id or name (a name several runs share: the newest), or the latest run."""
        row = self.store.run_row(None) if ref is None else q.find_run(self.store, str(ref), None).run
        return self._run(row)

    def sql(self, query: str):
        """Any query over the tables and views (`toolaudit sql`), as a DuckDB relation."""
        return q.relation(self.store, query)

    def _run(self, row: dict) -> Run:
        return Run(self, row["run_id"], row["name"], row["kind"], row["status"], row["baseline_name"],
                   row["candidate_name"])

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open(db: str | Path) -> Database:  # noqa: A001 (toolaudit.open, like sqlite_utils.Database / llm.get_model)
    """Open a database to read its runs."""
    return Database(db)


def compare(baseline_log: str | Path, candidate_log: str | Path | list[str | Path], db: str | Path,
            **options: Any) -> Run:
    """Compare two recorded logs into `db` (`toolaudit compare`); a list of candidate logs makes a remedy matrix
    (the matrix's run is returned). Options are `compare.logs.CompareOptions` fields (run_name, baseline_name,
    candidate_name, schema_dir, session_key, customer_key, pair_by, ...). Raises `CompareProblem` when the
    pairing cannot be trusted (the run is stored, as the CLI's exit 1 leaves it)."""
    from toolaudit.compare.job import CompareJob, run_compare
    from toolaudit.compare.logs import CompareOptions

    logs = candidate_log if isinstance(candidate_log, list) else [candidate_log]
    job = CompareJob(str(baseline_log), tuple(str(c) for c in logs), CompareOptions(**options))
    with Store(db) as store:
        outcome = run_compare(store, job)
    if outcome.problems:
        from toolaudit.compare.job import CompareProblem

        raise CompareProblem("; ".join(outcome.problems), outcome.run_id)
    return _reopen(db, outcome.run_id)


def replay(traces: str | Path | list[str | Path], db: str | Path, baseline: str = "target",
           candidate: str = "spec-ngram", **options: Any) -> Run:
    """Replay recorded calls through two decode paths into `db` (`toolaudit replay`); options are
    `replay.inputs.ReplayOptions` fields (limit, calls_per_session, noise_floor, paths_file, numerics, ...)."""
    from toolaudit.replay.inputs import ReplayOptions
    from toolaudit.replay.replayer import replay_traces

    files = [str(t) for t in ([traces] if isinstance(traces, (str, Path)) else traces)]
    with Store(db) as store:
        run_id, _ = replay_traces(store, ReplayOptions(traces=files, baseline=baseline, candidate=candidate,
                                                       **options))
    return _reopen(db, run_id)


def _reopen(db: str | Path, run_id: int) -> Run:
    """The run just written, in a read-only handle (the writer's connection is closed)."""
    return Database(db).run(run_id)
