"""Remedy matrices of recorded logs: one baseline log compared with several candidate logs of the same
requests (`toolaudit compare BASE A B ...`). Each candidate is an ordinary compare run attached to one `matrix`
run (`runs.matrix_id`), so every view, `summary`, `report` and `check` work on each, and `frontier` puts them
side by side. (Replays build their matrices in `replay.py`, decoding the baseline once.)"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from toolaudit import ConfigError, TraceError
from toolaudit.compare.logs import CompareOptions, Progress, RunCounts, compare_logs
from toolaudit.compare.scans import Scans
from toolaudit.store import Store


def compare_matrix(store: Store, baseline: str | Path, candidates: list[str | Path], names: list[str],
                   options: CompareOptions | None = None, progress: Progress | None = None,
                   scans: Scans | None = None) -> tuple[int, dict[str, tuple[int, RunCounts]]]:
    """Compare the baseline log with each candidate log; returns (matrix run id, {name: (run id, counts)}).
    `scans`: where the logs are scanned, as `compare_logs` takes it."""
    options = options or CompareOptions()
    if len(names) != len(candidates):
        raise ConfigError(f"{len(candidates)} candidate logs but {len(names)} candidate names")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"candidate name {repeated[0]!r} given twice; name each log with --candidate-name")
    matrix = store.create_run("matrix", options.run_name, options.baseline_name, ", ".join(names), str(baseline),
                              "; ".join(str(c) for c in candidates),
                              {"candidates": names, "session_key": options.session_key,
                               "customer_key": options.customer_key, "schema_dir": options.schema_dir})
    done: dict[str, tuple[int, RunCounts]] = {}
    try:
        for name, log in zip(names, candidates):
            label = f"{options.run_name or f'run-{matrix}'}/{name}"
            run_id, counts = compare_logs(store, baseline, log, replace(options, candidate_name=name,
                                                                        run_name=label), progress, scans)
            store.join_matrix(run_id, matrix)
            done[name] = run_id, counts
        store.finish_run(matrix, {"candidates": {name: run_id for name, (run_id, _) in done.items()}})
    except BaseException as exc:
        if not done and isinstance(exc, TraceError):  # the first log unusable: nothing compared, nothing kept
            store.discard_run(matrix)
        else:
            store.mark_interrupted([matrix])
        raise
    return matrix, done


def default_names(candidates: list[str]) -> list[str]:
    """Candidate labels from the file names (`spec-k3.jsonl` -> `spec-k3`), made unique with the parent folder
    when two files share a name."""
    stems = [Path(c).stem for c in candidates]
    return [f"{Path(c).parent.name}/{s}" if stems.count(s) > 1 else s for c, s in zip(candidates, stems)]
