"""What a replay reads before any engine runs: its options, the calls of the trace files (sampled, limited,
sharded) and the decode paths they name."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import orjson

from toolaudit import ConfigError, OptionError, StoreError
from toolaudit.engines.paths import PathConfig, load_paths
from toolaudit.engines.registry import ENGINES
from toolaudit.ingest.gaps import CallGaps, gap_warnings
from toolaudit.ingest.shards import shard_from_options
from toolaudit.ingest.traces import (
    DEFAULT_CUSTOMER_KEY,
    DEFAULT_SESSION_KEY,
    TraceCall,
    TraceLineError,
    TraceStats,
    read_trace,
)
from toolaudit.store import Store


@dataclass
class ReplayOptions:
    traces: list[str]
    baseline: str = "target"
    candidate: str = "spec-ngram"
    # Several candidates make a remedy matrix: the baseline runs once and each candidate is diffed against
    # its outputs (one matrix run holding one run per candidate). None: just `candidate`.
    candidates: list[str] | None = None
    paths_file: str | None = None
    limit: int | None = None
    run_name: str | None = None
    session_key: str = DEFAULT_SESSION_KEY
    customer_key: str = DEFAULT_CUSTOMER_KEY
    schema_dir: str | None = "schemas"
    # Calls handed to each engine per transaction. Larger than batch_size so continuous batching keeps its
    # slots full; a kill loses at most one chunk, which resume redoes.
    chunk: int = 64
    # None: path-major when an engine cannot be held beside another (see Replayer.path_major); True/False force.
    path_major: bool | None = None
    # Overrides the `numerics` key of every path whose engine accepts it as an override (the torch engine:
    # "auto" | "native" | "emulated"), e.g. for the demo. See `overrides`.
    numerics: str | None = None
    # Trace format (see `toolaudit.ingest.formats`); None detects it from each file's first record. Kept for --resume.
    trace_format: str | None = None
    # Replay only the first K calls of each session: a sample that keeps every session (and customer) in.
    calls_per_session: int | None = None
    # Only the sessions of one shard ({"index": K, "count": N}, see toolaudit.ingest.shards), after `limit`.
    shard: dict[str, int] | None = None
    # Also decode the baseline path again under another batch composition (`noise_floor_path`), as one more
    # candidate: its drift against the baseline is the floor every candidate's drift is read beside.
    noise_floor: bool = False
    # Overrides every path's `max_tokens` (a common key): an answer cut there is truncated, not compared.
    max_tokens: int | None = None
    # Override every path's `temperature` and `samples` (common keys): a sampled replay decodes each call N times
    # per path and tests the two outcome distributions (docs/statistics.md).
    temperature: float | None = None
    samples_per_call: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @property
    def candidate_names(self) -> list[str]:
        return list(self.candidates) if self.candidates else [self.candidate]

    @property
    def overrides(self) -> dict[str, Any]:
        """Run-wide path keys (the `--numerics` option sets `numerics`), for every engine that declares them."""
        return {"numerics": self.numerics} if self.numerics is not None else {}


def load_calls(options: ReplayOptions, session_lengths: dict[str, float] | None = None,
               warnings: list[str] | None = None) -> tuple[list[TraceCall], list[TraceLineError], dict[str, dict]]:
    """All usable calls of the trace files (first `limit`), the bad lines, and per-file accounting.

    `warnings`, when given, gets a line for each gap in a file's calls (no content, no tools, a session or
    customer key that matched nothing: `ingest.gaps`).

    `session_lengths`, when given, is filled with the mean calls per session in the traces per customer (and
    `(all)`), before any sampling, limit or shard: the session length a customer's traffic really has."""
    calls: list[TraceCall] = []
    errors: list[TraceLineError] = []
    stats: dict[str, dict] = {}
    for path in options.traces:
        st, gaps = TraceStats(), CallGaps()
        for item in read_trace(path, options.session_key, options.customer_key, require_response=False, stats=st,
                               fmt=options.trace_format):
            if isinstance(item, TraceLineError):
                errors.append(item)
            else:
                calls.append(item)
                gaps.add(item.session_id, item.customer, item.request)
        stats[str(path)] = st.__dict__
        if warnings is not None:
            warnings.extend(gap_warnings(gaps, path, options.session_key, options.customer_key))
    if session_lengths is not None:
        session_lengths.update(mean_session_lengths(calls))
    if options.calls_per_session is not None:
        seen: dict[str, int] = {}
        kept = []
        for call in calls:
            seen[call.session_id] = seen.get(call.session_id, 0) + 1
            if seen[call.session_id] <= options.calls_per_session:
                kept.append(call)
        calls = kept
    if options.limit is not None:
        calls = calls[: options.limit]
    shard = shard_from_options({"shard": options.shard})
    if shard is not None:  # whole sessions; input error rows belong to no session and are shard 1's
        calls = [c for c in calls if shard.holds(c.session_id)]
        errors = errors if shard.owns_unkeyed else []
    return calls, errors, stats


def mean_session_lengths(calls: list[TraceCall]) -> dict[str, float]:
    """{customer: mean calls per session} (customer `(none)` for calls without one) and `(all)`."""
    sessions: dict[str, tuple[str, int]] = {}
    for call in calls:
        customer, n = sessions.get(call.session_id, (call.customer or "(none)", 0))
        sessions[call.session_id] = customer, n + 1
    totals: dict[str, list[int]] = {"(all)": [0, 0]}
    for customer, n in sessions.values():
        for key in (customer, "(all)"):
            total = totals.setdefault(key, [0, 0])
            total[0] += n
            total[1] += 1
    return {k: calls_ / count for k, (calls_, count) in totals.items() if count}


def resolve_paths(options: ReplayOptions) -> tuple[PathConfig, list[PathConfig]]:
    """The baseline path and the candidate paths, by name (built-in or from the paths file)."""
    paths = load_paths(options.paths_file)
    names = options.candidate_names
    for name in (options.baseline, *names):
        if name not in paths:
            where = options.paths_file or "the built-in paths"
            raise OptionError(f"unknown decode path {name!r} (known in {where}: {', '.join(sorted(paths))})")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise OptionError(f"candidate path {repeated[0]!r} given twice")
    chosen = apply_overrides([paths[options.baseline], *(paths[n] for n in names)], options.overrides)
    if options.max_tokens is not None:
        chosen = [replace(p, max_tokens=options.max_tokens) for p in chosen]
    if options.temperature is not None:
        if options.temperature < 0:
            raise OptionError(f"--temperature must be >= 0 (got {options.temperature})")
        chosen = [replace(p, temperature=options.temperature) for p in chosen]
    if options.samples_per_call is not None:
        if options.samples_per_call < 1:
            raise OptionError(f"--samples must be a positive integer (got {options.samples_per_call})")
        chosen = [replace(p, samples=options.samples_per_call) for p in chosen]
    for p in chosen:
        if p.samples > 1 and p.temperature == 0:
            raise OptionError(f"path {p.name!r}: {p.samples} samples per call need temperature > 0 (greedy decoding "
                              "gives the same answer every time): set --temperature or the path's temperature")
    per_chunk = min(options.chunk, options.limit or options.chunk)  # calls an engine gets at once, at most
    # The baseline against itself: decoded in the same batches both copies always agree and measure nothing, so
    # the second copy is the noise-floor path (other batch neighbours).
    chosen = [chosen[0], *(noise_floor_path(chosen[0], per_chunk) if n == options.baseline else p
                           for n, p in zip(names, chosen[1:]))]
    if options.noise_floor and options.baseline in names:
        raise OptionError("--noise-floor with the baseline as a candidate: that candidate is the noise floor already")
    if options.noise_floor:
        floor = noise_floor_path(chosen[0], per_chunk)
        if floor.name in paths or floor.name in names:
            raise ConfigError(f"--noise-floor: a path named {floor.name!r} exists already; rename it")
        chosen.append(floor)
    return chosen[0], chosen[1:]


# Engine keys that set how many calls decode together (torch `max_batch`, vLLM `max_num_seqs`, an endpoint's
# `concurrency`): like `batch_size`, batch composition, not decoding.
BATCH_KEYS = ("max_batch", "max_num_seqs", "concurrency")
MAX_FLOOR_ROWS = 512  # the torch engine's largest fixed-shape bucket (`layout.MAX_FIXED_ROWS`)


def noise_floor_path(baseline: PathConfig, chunk: int | None = None) -> PathConfig:
    """The baseline decoded again with other batch neighbours, so each call shares its steps with other calls, in
    other shapes. Everything else is the baseline's, so its drift against the baseline is batching noise alone (a
    run on identical batches would always agree and measure nothing).

    How many rows decode together: twice the baseline's where a chunk of the run (`chunk`: the calls handed to
    the engine at once, the run's `--limit` if smaller) holds at least that many, so the floor costs fewer
    steps than the baseline instead of twice as many (a step costs about the same for 8 rows or 32, on a GPU
    and on a CPU alike); otherwise half (2 for a batch-1 path), since twice the rows of a chunk that small
    would be the same batches again. The same for `max_batch` / `max_num_seqs` where the path sets them (half
    where twice would pass the fixed-shape limit). An endpoint's `concurrency` is always halved: a floor
    should not double the load on someone's server; its batches differ as well. At temperature > 0 it also
    draws with other seeds (the seed + 1): there the floor is sampling noise too, and a sampled run's floor is
    the calibration of its distribution test (the same path against itself with other seeds must not shift)."""
    rows = max([baseline.batch_size, *(v for k, v in baseline.options.items()
                                       if k in BATCH_KEYS and k != "concurrency" and isinstance(v, int))])
    more = chunk is not None and chunk >= 2 * rows and 2 * rows <= MAX_FLOOR_ROWS

    def other(n: int, key: str = "batch_size") -> int:
        if more and key != "concurrency":
            return 2 * n
        return 2 if n <= 1 else n // 2

    options = dict(baseline.options)
    for key in BATCH_KEYS:
        if isinstance(options.get(key), int):
            options[key] = other(options[key], key)
    seed = baseline.seed + 1 if baseline.temperature > 0 else baseline.seed
    return replace(baseline, name=f"{baseline.name}-floor", batch_size=other(baseline.batch_size), options=options,
                   seed=seed)


def apply_overrides(paths: list[PathConfig], overrides: dict[str, Any]) -> list[PathConfig]:
    """Each override set on every path whose engine declares the key (`Capabilities.overrides`), validated by
    that engine as if paths.toml set it. An override no chosen path accepts is an error, not a silent no-op."""
    for key, value in overrides.items():
        specs = {p.name: ENGINES.spec(p.engine, f"paths.{p.name}") for p in paths}
        takers = [p.name for p in paths if key in specs[p.name].capabilities.overrides]
        if not takers:
            accept = sorted(name for name, spec in ENGINES.items() if key in spec.capabilities.overrides)
            raise OptionError(f"{key}: no path of this run accepts it (engines that do: "
                              f"{', '.join(accept) or 'none'}; the paths' engines: "
                              f"{', '.join(sorted({p.engine for p in paths}))})")
        paths = [specs[p.name].with_override(p, key, value) if p.name in takers else p for p in paths]
    return paths


def options_for_resume(store: Store, run_id: int) -> tuple[int, ReplayOptions]:
    """The run to resume (a matrix rather than one of its candidates) and the options it was started with."""
    run = store.run_row(run_id)
    if run["matrix_id"] is not None:
        run = store.run_row(run["matrix_id"])
    matrix_of_replays = run["kind"] == "matrix" and all(m["kind"] == "replay"
                                                        for m in store.matrix_members(run["run_id"]))
    if run["kind"] != "replay" and not matrix_of_replays:
        raise StoreError(f"run {run_id} is a {run['kind']} run; only replay runs can be resumed")
    saved = orjson.loads(run["options"])
    fields = ReplayOptions.__dataclass_fields__
    return run["run_id"], ReplayOptions(**{k: v for k, v in saved.items() if k in fields})


