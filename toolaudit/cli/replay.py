"""Commands that drive decode engines: `replay`, `demo`, `fingerprint`."""

from __future__ import annotations

from pathlib import Path

import click

from toolaudit.cli.collect import Selected, check_collected, collected_options, select
from toolaudit.cli.common import (
    Progress,
    Proportion,
    db_option,
    example,
    format_option,
    friendly_errors,
    key_options,
    option_group,
    output_options,
    print_rows,
    ray_options,
    ray_settings,
    schema_dir_or_none,
    shard_option,
    verbose_option,
)
from toolaudit.cli.interrupts import interruptible, watch_store
from toolaudit.cli.show import show_run
from toolaudit.replay.demo import (
    DEMO_CALLS,
    DEMO_MAX_TOKENS,
    DEMO_SAMPLED_CALLS,
    DEMO_SAMPLED_MAX_TOKENS,
    DEMO_SAMPLES,
    DEMO_TEMPERATURE,
)
from toolaudit.report.output import to_json


def _run_replay(db: str, options, resume: int | None, fmt: str, budget=None, verbose: bool = False,
                ray=None, probe: bool = False) -> None:
    from toolaudit.engines import ENGINES, threads
    from toolaudit.engines.logs import EngineLogs, log_file_for

    logs = EngineLogs(None if verbose else log_file_for(db))
    try:
        _replay_into(db, options, resume, fmt, budget, logs, ray, probe)
    finally:  # also after a failure: the engines' log often says why
        line = threads.summary_line()  # e.g. "torch threads: 1 (2 cores, 1 busy; OMP_WAIT_POLICY=passive)"
        if line:
            click.echo(line, err=True)
        for line in logs.summary(note for spec in ENGINES.values() for note in spec.notes):
            click.echo(line, err=True)


def _replay_into(db: str, options, resume: int | None, fmt: str, budget, logs, ray=None, probe: bool = False) -> None:
    from toolaudit.replay.replayer import replay_traces
    from toolaudit.store import Store

    engines = None
    if ray is not None:  # engine calls on a Ray cluster; the rows are written here as in process
        from toolaudit.replay.ray_pool import RayEnginePool

        engines = RayEnginePool(ray, logs=logs)
    with Store(db) as store:
        watch_store(store)  # Ctrl-C or SIGTERM: `interruptible` prints `replay --resume RUN`
        bar = _LazyBar(store.publish_snapshots("replay", on_error=_warn))  # readers follow the run meanwhile
        try:
            run_id, counts = replay_traces(store, options, progress=bar.update, resume=resume,
                                           on_total=bar.start, logs=logs, engines=engines,
                                           on_probe=_warn_line if probe and ray is None else None)
        finally:
            bar.close()
        for warning in counts.warnings:
            click.echo(f"warning: {warning}", err=True)
        if counts.skipped:
            click.echo(f"resumed run {run_id}: {counts.skipped} calls already stored, {counts.replayed} replayed",
                       err=True)
        show_run(store, run_id, fmt, db, budget)


def _warn(message: str) -> None:
    click.echo(f"warning: {message}", err=True)


def _warn_line(line: str) -> None:
    click.echo(line, err=True)


# A run's paths are probed first (`fingerprint --probe`), unless --no-probe or $TOOLAUDIT_NO_PROBE says not to.
no_probe_option = click.option("--no-probe", is_flag=True, envvar="TOOLAUDIT_NO_PROBE", help="Do not probe the "
                               "paths first (a probe fingerprint per path, stored with the run; seconds per path; "
                               "or set TOOLAUDIT_NO_PROBE=1). Not with --ray, which never probes.")


class _LazyBar:
    """Progress that learns its length once the calls to replay are known; one line per chunk when piped. Each
    chunk's progress (counted after its commit) goes to the snapshot readers open meanwhile."""

    def __init__(self, snapshots=None) -> None:
        self.progress: Progress | None = None
        self.snapshots = snapshots  # a store.snapshot.SnapshotPublisher
        self.done = 0

    def start(self, total: int) -> None:
        self.progress = Progress("replaying", total, unit=" calls", log_every=1).__enter__()
        if self.snapshots is not None:
            self.snapshots.update(0, total)

    def update(self, n: int) -> None:
        self.done += n
        if self.progress is not None:
            self.progress.update(n)
        if self.snapshots is not None:
            self.snapshots.update(self.done)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.__exit__(None, None, None)
            self.progress = None


REPLAY_OPTIONS = option_group(
    click.argument("traces", nargs=-1, type=click.Path(dir_okay=False)),
    click.option("--baseline", default="target", show_default=True, help="Baseline decode path name."),
    click.option("--candidate", "candidates", multiple=True, default=("spec-ngram",), show_default=True,
                 help="Candidate decode path name; repeat it for a remedy matrix (the baseline decoded once, each "
                      "candidate diffed against it, see `toolaudit frontier`)."),
    click.option("--paths", "paths_file", type=click.Path(dir_okay=False, exists=True),
                 help="paths.toml with [paths.NAME] tables (default: built-in target and spec-ngram)."),
    db_option,
    click.option("--limit", type=click.IntRange(1), help="Replay only the first N calls."),
    click.option("--calls-per-session", type=click.IntRange(1), metavar="K",
                 help="Replay only the first K calls of each session (a sample that keeps every session)."),
    click.option("--resume", type=int, metavar="RUN", help="Finish an interrupted replay run."),
    click.option("--chunk", type=click.IntRange(1), default=64, show_default=True,
                 help="Calls per engine call and per transaction (a kill loses at most one chunk)."),
    click.option("--run-name", help="A name for this run (default run-<id>); other commands' --run takes it."),
    click.option("--noise-floor", is_flag=True, help="Also decode the baseline again with other batch neighbours (half "
                 "its batch size) and show every candidate's drift beside that floor, and beyond it paired by call."),
    click.option("--numerics", metavar="MODE", help="Set the `numerics` key of every path whose engine takes it as "
                 "a run-wide override (torch: auto, native or emulated bf16/fp16 numerics)."),
    click.option("--max-tokens", type=click.IntRange(1), help="Set every path's max_tokens (an answer cut there is "
                 "stored as truncated, not compared)."),
    click.option("--temperature", type=click.FloatRange(0),
                 help="Set every path's temperature (> 0: sampled decoding)."),
    click.option("--samples", "samples_per_call", type=click.IntRange(1), metavar="N",
                 help="Decode each call N times per path (temperature > 0) and test whether the candidate's tool-call "
                      "distribution differs from the baseline's, call by call and run-wide (docs/statistics.md)."),
    format_option,
    key_options,
    click.option("--schemas", "schema_dir", default="schemas", show_default=True, type=click.Path(file_okay=False),
                 help="Folder of <tool>.json schemas that override the request's."),
    shard_option,
    collected_options,
    ray_options("Run the engines", "engine workers per pass, one per GPU or CPU slot"),
    no_probe_option,
    verbose_option,
    output_options,
)


@click.command(epilog=example("toolaudit replay traces/demo.jsonl --baseline target --candidate spec-ngram "
                             "--calls-per-session 3 --run-name nightly --db audit.duckdb"))
@REPLAY_OPTIONS
@friendly_errors
@interruptible
def replay(traces: tuple[str, ...], baseline: str, candidates: tuple[str, ...], paths_file: str | None, db: str,
           limit: int | None, calls_per_session: int | None, resume: int | None, chunk: int,
           run_name: str | None, noise_floor: bool, numerics: str | None, max_tokens: int | None,
           temperature: float | None, samples_per_call: int | None, trace_format: str, session_key: str,
           customer_key: str, schema_dir: str, shard, collected: str | None, since: str | None, sample: int | None,
           per_customer: bool, seed: str, ray_address: str | None, ray_workers: int | None, no_probe: bool,
           verbose: bool, fmt: str) -> None:
    """Replay recorded calls through a baseline and one or more candidate decode paths and diff their tool calls.

    Trace files may be in any format `compare` reads (detected from the first record unless --format says), or
    a sample of the traffic `toolaudit collect` kept (--collected DIR, --since, --sample, --per-customer)."""
    from toolaudit.replay.replayer import ReplayOptions

    ray = ray_settings(ray_address, ray_workers)
    check_collected(collected, since, sample, per_customer, seed)
    _check_resume(resume, bool(traces or collected), bool(shard or numerics or noise_floor or max_tokens
                                                          or temperature is not None or samples_per_call))
    if collected is not None and traces:
        raise click.UsageError("give trace files or --collected DIR, not both")
    if collected is not None:
        selected = Selected(collected, db, since, sample, per_customer, seed, session_key, customer_key, trace_format)
        traces = (str(select(selected, "replay").path),)
    options = ReplayOptions(traces=[str(t) for t in traces], baseline=baseline, candidate=candidates[0],
                            candidates=list(candidates) if len(candidates) > 1 else None,
                            paths_file=paths_file, limit=limit, calls_per_session=calls_per_session,
                            run_name=run_name, chunk=chunk, session_key=session_key,
                            customer_key=customer_key, schema_dir=schema_dir_or_none(schema_dir),
                            trace_format=None if trace_format == "auto" else trace_format,
                            shard=shard.as_dict() if shard else None, numerics=numerics, noise_floor=noise_floor,
                            max_tokens=max_tokens, temperature=temperature, samples_per_call=samples_per_call)
    if resume is None:
        _warn_sampling_noise(options)
    _run_replay(db, options, resume, fmt, verbose=verbose, ray=ray, probe=not no_probe)


def _check_resume(resume: int | None, inputs: bool, settings: bool) -> None:
    """A replay names its inputs, or resumes a run, which brings its own inputs and settings."""
    if resume is None and not inputs:
        raise click.UsageError("give trace files to replay, --collected DIR, or --resume RUN")
    if resume is not None and (inputs or settings):
        raise click.UsageError("--resume takes its traces, paths, numerics, max_tokens, temperature, samples, shard "
                               "and noise floor from the run; do not pass trace files, --collected, --numerics, "
                               "--max-tokens, --temperature, --samples, --shard or --noise-floor")


def _warn_sampling_noise(options) -> None:
    """At temperature > 0 with one sample per call, say what the per-call figures measure, before the run."""
    from toolaudit.replay.inputs import resolve_paths

    baseline, candidates = resolve_paths(options)
    noisy = [p for p in (baseline, *candidates) if p.temperature > 0 and p.samples == 1]
    if noisy:
        temps = ", ".join(f"{p.name} {p.temperature:g}" for p in noisy)
        _warn(f"sampled decoding (temperature: {temps}) with one sample per call: a call whose answers differ "
              "measures sampling noise, not drift; use --samples N (e.g. 16) to test whether the tool-call "
              "distribution moved (docs/statistics.md)")


DEMO_OPTIONS = option_group(
    db_option,
    click.option("--limit", type=click.IntRange(1), help=f"Replay only the first N calls of the sample (default: "
                 f"{DEMO_CALLS}; --matrix: every session)."),
    click.option("--numerics", type=click.Choice(["auto", "native", "emulated"]), default="auto", show_default=True,
                 help="bf16 numerics: native kernels, or emulated on float32 kernels (auto: native where the CPU "
                      "has bf16 matmul, e.g. AVX512-BF16/AMX; emulated on AVX2-only CPUs)."),
    click.option("--matrix", is_flag=True, help="A remedy matrix instead: target against spec-ngram, spec-ngram-k3, "
                 "spec-ngram-fp32, spec-draft (the target's first 8 layers as draft model) and spec-ngram-invariant "
                 "(batch-invariant kernels) on the first 2 calls of each session, with the recommendation per "
                 "customer."),
    click.option("--max-session-drift", type=Proportion(), default="10%", show_default=True,
                 help="With --matrix: the session drift budget the recommendation uses."),
    click.option("--sampled", is_flag=True, help=f"Sampled decoding instead: temperature {DEMO_TEMPERATURE}, N samples "
                 f"(--samples) of the first call of {DEMO_SAMPLED_CALLS} sessions per path; whether spec-ngram keeps "
                 "the target's tool-call distribution, beside the calibration line (the target against itself with "
                 "other seeds)."),
    click.option("--samples", type=click.IntRange(2), default=DEMO_SAMPLES, show_default=True,
                 help="With --sampled: samples per call and path."),
    click.option("--noise-floor/--no-noise-floor", default=True, show_default=True,
                 help="Decode the baseline a second time with other batch neighbours (64 rows against 32) and show "
                      "the drift beside that floor (the demo's calls cost about a third more)."),
    click.option("--max-tokens", type=click.IntRange(1),
                 help=f"Generated tokens per call at most, on every path (an answer cut there is truncated, not "
                      f"compared; default {DEMO_MAX_TOKENS}, --sampled {DEMO_SAMPLED_MAX_TOKENS})."),
    click.option("--probe/--no-probe", "probe", default=False, show_default=True,
                 help="Probe the paths first, as `replay` does (a probe fingerprint per path stored with the run; "
                      "seconds per path). Off in the demo: the probe is not the demo's finding, and `toolaudit "
                      "fingerprint --probe` runs it on its own."),
    verbose_option,
    output_options,
)


@click.command(epilog=example("toolaudit demo --db demo.duckdb"))
@DEMO_OPTIONS
@friendly_errors
@interruptible
def demo(db: str, limit: int | None, numerics: str, matrix: bool, max_session_drift: float, sampled: bool,
         samples: int, noise_floor: bool, max_tokens: int | None, probe: bool, verbose: bool, fmt: str) -> None:
    """Replay 120 demo calls (2 per session) through target vs spec-ngram (bf16); print drift beside its floor."""
    from toolaudit.engines import make_engine
    from toolaudit.replay.demo import DemoChoice, demo_description, demo_options
    from toolaudit.replay.inputs import resolve_paths

    Path(db).resolve().parent.mkdir(parents=True, exist_ok=True)
    if sampled and matrix:
        raise click.UsageError("--sampled and --matrix are two demos: give one")
    options = demo_options(DemoChoice(matrix, sampled, limit, numerics, noise_floor, max_tokens, samples))
    # What the baseline engine says of itself: the numerics it resolved `--numerics` to, on which CPU.
    baseline, chosen = resolve_paths(options)
    components = make_engine(baseline).fingerprint_components()
    floor = chosen[-1] if options.noise_floor and not sampled else None
    rows = None if matrix else baseline.batch_size
    click.echo(f"{demo_description(options, floor, components['numerics'], components['cpu_capability'], rows)}; "
               f"results in {db}", err=True)
    budget = None
    if matrix:
        from toolaudit.analysis.frontier import Budget

        budget = Budget(max_session_drift=max_session_drift)
    _run_replay(db, options, None, fmt, budget, verbose=verbose, probe=probe)
    if matrix and fmt == "table":
        click.echo(f"\nbudget: session drift <= {100 * max_session_drift:g}% on the 95% upper bound "
                   f"(--max-session-drift); remedy reports: toolaudit report --all-customers --max-session-drift "
                   f"{100 * max_session_drift:g}% --db {db}")


FINGERPRINT_OPTIONS = option_group(
    click.option("--path", "path_name", required=True, help="Decode path name."),
    click.option("--paths", "paths_file", type=click.Path(dir_okay=False, exists=True), help="paths.toml."),
    click.option("--probe", is_flag=True, help="Also fingerprint what the path does: decode a fixed probe set greedily "
                 "and hash the chosen tokens (decisions) and their logprobs (numerics)."),
    click.option("--probe-file", type=click.Path(dir_okay=False), help="With --probe: your own probe set (JSONL, one "
                 "chat completion request per line) instead of the bundled one."),
    click.option("--repeats", type=click.IntRange(1, 10), default=2, show_default=True,
                 help="With --probe: decode the probe set this many times; repeats that differ are reported as "
                      "jitter."),
    click.option("--db", "db", envvar="TOOLAUDIT_DB", type=click.Path(dir_okay=False),
                 help="With --probe: store the probe in this DuckDB file (or set TOOLAUDIT_DB)."),
    click.option("--against", metavar="REF", help="With --probe and --db: compare with an earlier probe (latest: the "
                 "path's newest; probe:ID, or an id) or the probe a run recorded (run:ID|NAME, or a name), in words."),
    click.option("--expect", metavar="FP", help="With --probe: exit 1 unless the probe's numerics hash is FP (an 8+ "
                 "character prefix), saying whether decisions or only numerics changed when --db holds that probe. "
                 "`check --expect-numerics` then gates on the stored probe."),
    output_options,
)


@click.command(name="fingerprint", epilog=example("toolaudit fingerprint --path spec-ngram --json",
                                                  "toolaudit fingerprint --probe --path spec-ngram --against nightly "
                                                  "--db audit.duckdb",
                                                  "toolaudit fingerprint --probe --path spec-ngram --expect "
                                                  "num-3f2a9c1e --db audit.duckdb"))
@FINGERPRINT_OPTIONS
@friendly_errors
def fingerprint_cmd(path_name: str, paths_file: str | None, probe: bool, probe_file: str | None, repeats: int,
                    db: str | None, against: str | None, expect: str | None, fmt: str) -> None:
    """Print the stable fingerprint of a decode path (engine, versions, model hashes, config, device).

    With --probe, also its behavioural fingerprint: what a runtime change that the config does not name shows."""
    from toolaudit import OptionError
    from toolaudit.engines import make_engine
    from toolaudit.engines.fingerprint import fingerprint
    from toolaudit.engines.paths import load_paths

    paths = load_paths(paths_file)
    if path_name not in paths:
        raise OptionError(f"unknown decode path {path_name!r} (known: {', '.join(sorted(paths))})")
    db_given = click.get_current_context().get_parameter_source("db") == click.core.ParameterSource.COMMANDLINE
    if not probe and (probe_file or against or expect or db_given):  # TOOLAUDIT_DB alone is no request to probe
        raise click.UsageError("--probe-file, --db, --against and --expect go with --probe")
    if probe:
        from toolaudit.cli.probe import probe_command

        if fmt == "csv":
            raise click.UsageError("--probe prints a table or JSON (--as table|json)")
        probe_command(paths[path_name], probe_file, repeats, db, against, expect, fmt != "table")
        return
    components = make_engine(paths[path_name]).fingerprint_components()
    fp = fingerprint(components)
    if fmt == "json":
        click.echo(to_json({"path": path_name, "fingerprint": fp, "components": components}))
    elif fmt == "csv":
        print_rows(["component", "value"], [["fingerprint", fp], *components.items()], "csv")
    else:
        click.echo(fp)
