"""The run rows of a replay: one run, or a remedy matrix (a `matrix` run holding one run per candidate), and
the candidates ("members") a run drives. Fingerprints and configs of both paths are stored with each run, so a
run reads on its own and a resume can rebuild its paths."""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from toolaudit import ConfigError
from toolaudit.analysis.runs import run_options
from toolaudit.compare.pairs import Analyzer
from toolaudit.engines.fingerprint import fingerprint
from toolaudit.engines.paths import PathConfig
from toolaudit.replay.engine_pool import EnginePool
from toolaudit.replay.inputs import BATCH_KEYS, ReplayOptions
from toolaudit.store import Store
from toolaudit.validate.schemas import SchemaRegistry

Key = tuple[str, int]


@dataclass
class Member:
    """One candidate of a run: the run that holds its rows, its path, and the calls it still lacks."""

    run_id: int
    path: PathConfig
    analyzer: Analyzer
    todo: set[Key] = field(default_factory=set)
    errors: int = 0


class RunRows:
    """Creates a replay's run rows and finds the members of an existing one."""

    def __init__(self, store: Store, options: ReplayOptions, baseline: PathConfig, candidates: list[PathConfig],
                 engines: EnginePool):
        self.store, self.options, self.engines = store, options, engines
        self.baseline, self.candidates = baseline, candidates

    def create(self) -> int:
        """One run, or a matrix run and one run per candidate, written in one transaction (a matrix stopped
        half-made would resume without its missing candidates). Returns the run to drive."""
        base = self.baseline
        base_components = self.engines.fingerprint_components(base)
        components = [self.engines.fingerprint_components(p) for p in self.candidates]
        with self.store.transaction():
            if len(self.candidates) == 1:
                return self._create_member(self.candidates[0], base_components, components[0], None)
            names = [p.name for p in self.candidates]
            options = self.options.as_dict() | {"baseline_config": base.config_dict(),
                                                "baseline_fingerprint_components": base_components}
            matrix = self.store.create_run("matrix", self.options.run_name, base.name, ", ".join(names),
                                           describe(base), "; ".join(describe(p) for p in self.candidates),
                                           options, fingerprint(base_components))
            for path, mine in zip(self.candidates, components):
                self._create_member(path, base_components, mine, matrix)
        return matrix

    def _create_member(self, path: PathConfig, base_components: dict, components: dict,
                       matrix_id: int | None) -> int:
        options = self.options.as_dict() | {
            "candidate": path.name,
            "baseline_config": self.baseline.config_dict(),
            "candidate_config": path.config_dict(),
            "baseline_fingerprint_components": base_components,
            "candidate_fingerprint_components": components,
            "noise_floor": same_decoding(self.baseline, path),
            # samples per call (the larger side's): > 1 makes a sampled run, with `samples` and `sampled_calls`
            "samples": max(self.baseline.samples, path.samples),
        }
        name = self.options.run_name
        if matrix_id is not None:
            options["candidates"] = None
            name = f"{name}/{path.name}" if name else None
        return self.store.create_run("replay", name, self.baseline.name, path.name, describe(self.baseline),
                                     describe(path), options, fingerprint(base_components), fingerprint(components),
                                     matrix_id)

    def members(self, run_id: int) -> list[Member]:
        """The candidates of the run (itself, or each candidate's run of a matrix), sharing one schema registry.
        Each run must decode as it started (`check_same_paths`): a resume never mixes two paths in one run."""
        registry = SchemaRegistry(self.options.schema_dir)
        run = self.store.run_row(run_id)
        if run["kind"] != "matrix":
            check_same_paths(run, self.baseline, self.candidates[0])
            return [Member(run_id, self.candidates[0], Analyzer(run_id, registry))]
        by_name = {p.name: p for p in self.candidates}
        rows = self.store.matrix_members(run_id)
        for row in rows:
            check_same_paths(row, self.baseline, by_name[row["candidate_name"]])
        return [Member(m["run_id"], by_name[m["candidate_name"]], Analyzer(m["run_id"], registry)) for m in rows]


def check_same_paths(run: dict, baseline: PathConfig, candidate: PathConfig) -> None:
    """Refuse to go on with a run whose paths, rebuilt now (from its paths file, by this build), are not the ones
    it recorded (`baseline_config`, `candidate_config`): an edited paths file, or a build that decodes otherwise
    (e.g. where answers end), would decode the rest of the calls as another path and mix two paths' drift in one
    figure. Runs that recorded no config are not checked."""
    options = run_options(run)
    changed = []
    for side, path in (("baseline", baseline), ("candidate", candidate)):
        recorded = options.get(f"{side}_config")
        if not isinstance(recorded, dict):
            continue
        now = orjson.loads(orjson.dumps(path.config_dict(), default=str))
        changed += [f"{side} {path.name!r} {key}: {recorded.get(key)!r} then, {now.get(key)!r} now"
                    for key in sorted(set(recorded) | set(now)) if recorded.get(key) != now.get(key)]
    if changed:
        raise ConfigError(f"run {run['run_id']} cannot go on: its paths are not the ones it started with ("
                          + "; ".join(changed) + "). The calls it has were decoded by the earlier paths: start a "
                          "new run, or restore the earlier paths file or build to resume this one")


def same_decoding(a: PathConfig, b: PathConfig) -> bool:
    """A noise-floor run: the same path on both sides, batch size (and the engine keys that set it) and seed
    aside: batch shape is itself a source of drift, which is what a batch-size noise floor measures, and other
    seeds are what a sampled floor draws with."""
    first, second = a.config_dict(), b.config_dict()
    for config in (first, second):
        config.pop("batch_size", None)
        config.pop("seed", None)
        config["options"] = {k: v for k, v in (config.get("options") or {}).items() if k not in BATCH_KEYS}
    return first == second


def describe(path: PathConfig) -> str:
    spec = path.speculative
    what = f"{path.engine}:{path.model} {path.dtype} batch {path.batch_size}"
    return what + (f" spec {spec.method} k={spec.num_speculative_tokens}" if spec else " target-only")
