"""`toolaudit merge`: combine the shard runs of one comparison or replay into one run that equals the unsharded run.

The runs must be of the same comparison: same kind, decode-path names, sources, fingerprints, toolaudit
version and options (the shard and the run name aside), each complete, and their shards distinct shards of the
same N (a run without a shard is shard 1/1). A shard given twice, or two runs holding the same call, is refused:
nothing is counted twice. Merging the same runs into the same file again (e.g. after the first merge was killed,
not knowing whether it got to its commit) finds the run it made and adds none. Shards that do not cover 1..N
are merged anyway into a run with status `partial` (its options name the missing shards), with a warning: its
figures describe the merged sessions only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import orjson

from toolaudit import RunNotFound, StoreError
from toolaudit.ingest.shards import Shard, merge_counts, shard_from_options
from toolaudit.store import Store
from toolaudit.store.merge import merge_into, merged_before, source_runs
from toolaudit.store.queries import call_count
from toolaudit.store.vocabulary import MISMATCHES_SHOWN

# Options that may differ between the shards of one comparison.
_PER_SHARD_OPTIONS = ("shard", "run_name")
# Columns of `runs` that must agree.
_SAME_COLUMNS = ("kind", "baseline_name", "candidate_name", "baseline_source", "candidate_source",
                 "baseline_fingerprint", "candidate_fingerprint", "toolaudit_version")


@dataclass
class MergeResult:
    run_id: int
    status: str  # complete | partial
    count: int  # N
    merged: list[int] = field(default_factory=list)  # shard indices merged
    missing: list[int] = field(default_factory=list)
    calls: int = 0
    already: bool = False  # these runs were merged into this file before: the run is that merge's


def parse_input(text: str) -> tuple[str, int | None]:
    """`FILE` (its latest run) or `FILE@RUN`."""
    if os.path.exists(text) or "@" not in text:
        return text, None
    path, _, run = text.rpartition("@")
    if not run.isdigit():
        return text, None
    return path, int(run)


def _options(run: dict) -> dict[str, Any]:
    try:
        options = orjson.loads(run["options"]) if run.get("options") else {}
    except orjson.JSONDecodeError:
        options = {}
    return options if isinstance(options, dict) else {}


def _pick(path: str, run_id: int | None) -> dict:
    if not os.path.exists(path):
        raise RunNotFound(f"{path}: no such database")
    runs = source_runs(path)
    if not runs:
        raise RunNotFound(f"{path}: holds no runs")
    if run_id is None:
        return runs[-1]
    for run in runs:
        if run["run_id"] == run_id:
            return run
    raise RunNotFound(f"{path}: no run with id {run_id}")


def _check(labels: list[str], runs: list[dict]) -> list[Shard]:
    first = runs[0]
    for label, run in zip(labels, runs):
        if run["kind"] == "matrix":
            raise StoreError(f"cannot merge {label}: run {run['run_id']} is a remedy matrix; merge each "
                             "candidate's run (FILE@RUN, see `toolaudit runs`) into its own database")
        if run["status"] != "complete":
            raise StoreError(f"cannot merge {label}: run {run['run_id']} is {run['status']}, not complete "
                             "(finish it first, e.g. `toolaudit replay --resume`)")
        for column in _SAME_COLUMNS:
            if run[column] != first[column]:
                raise StoreError(f"cannot merge: {column} differs ({labels[0]}: {first[column]!r}, "
                                 f"{label}: {run[column]!r}); merge only shards of one comparison")
    base = {k: v for k, v in _options(first).items() if k not in _PER_SHARD_OPTIONS}
    for label, run in zip(labels, runs):
        other = {k: v for k, v in _options(run).items() if k not in _PER_SHARD_OPTIONS}
        if other != base:
            keys = sorted(k for k in base.keys() | other.keys() if base.get(k) != other.get(k))
            raise StoreError(f"cannot merge: options differ between {labels[0]} and {label} "
                             f"({', '.join(keys)}); merge only shards of one comparison")
    shards = [shard_from_options(_options(run)) or Shard(1, 1) for run in runs]
    counts = {s.count for s in shards}
    if len(counts) > 1:
        listed = ", ".join(f"{label}: {shard}" for label, shard in zip(labels, shards))
        raise StoreError(f"cannot merge: shards of different N ({listed})")
    seen: dict[int, str] = {}
    for label, shard in zip(labels, shards):
        if shard.index in seen:
            raise StoreError(f"cannot merge: shard {shard} given twice ({seen[shard.index]} and {label}); "
                             "each shard may be merged once")
        seen[shard.index] = label
    return shards


def merge_runs(store: Store, inputs: list[str], run_name: str | None = None) -> MergeResult:
    """Merge the runs named by `inputs` (`FILE` or `FILE@RUN`) into one new run of `store`."""
    if not inputs:
        raise StoreError("nothing to merge: give the shard databases")
    target = os.path.realpath(store.path)
    picked = [parse_input(text) for text in inputs]
    for path, _ in picked:
        if os.path.exists(path) and os.path.realpath(path) == target:
            raise StoreError(f"{path}: is the --db being written; merge into another file")
    runs = [_pick(path, run_id) for path, run_id in picked]
    labels = [f"{path}@{run['run_id']}" for (path, _), run in zip(picked, runs)]
    shards = _check(labels, runs)
    count = shards[0].count
    merged = sorted(s.index for s in shards)
    missing = sorted(set(range(1, count + 1)) - set(merged))
    order = sorted(range(len(runs)), key=lambda i: shards[i].index)
    runs, labels, picked = [runs[i] for i in order], [labels[i] for i in order], [picked[i] for i in order]
    counts = merge_counts(runs[0]["kind"], [orjson.loads(r["counts"]) if r["counts"] else {} for r in runs],
                          MISMATCHES_SHOWN)
    options = {k: v for k, v in _options(runs[0]).items() if k not in _PER_SHARD_OPTIONS}
    if "run_name" in _options(runs[0]):
        options["run_name"] = run_name
    options["merged_from"] = [{"db": path, "run_id": run["run_id"], "shard": str(shard)}
                              for (path, _), run, shard in zip(picked, runs, sorted(shards, key=lambda s: s.index))]
    status = "complete"
    if missing:
        status = "partial"
        options["shards_missing"] = missing
        counts["shards"] = {"count": count, "merged": merged, "missing": missing}
    run = dict(runs[0]) | {"name": run_name, "options": options,
                           "created_at": min(r["created_at"] for r in runs),
                           "finished_at": max(r["finished_at"] for r in runs if r["finished_at"] is not None)}
    run_id = merged_before(store, run)
    if run_id is not None:
        return MergeResult(run_id, status, count, merged, missing, call_count(store, run_id), already=True)
    run_id = merge_into(store, [(path, r["run_id"]) for (path, _), r in zip(picked, runs)], run, counts, status)
    return MergeResult(run_id, status, count, merged, missing, call_count(store, run_id))
