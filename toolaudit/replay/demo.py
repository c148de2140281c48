"""The demo's samples (`toolaudit demo`): which bundled calls, through which paths, with which options. The
library holds them so that the CLI, the API and the benchmarks run the same demo."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CLI reads this module's constants for its help: kept light
    from toolaudit.replay.inputs import ReplayOptions

REPO_ROOT = Path(__file__).resolve().parents[2]
DEMO_TRACES = REPO_ROOT / "traces" / "demo.jsonl"
# The greedy and sampled demos' paths: the built-in target and spec-ngram at 32 rows and 64 tokens (the file says
# why); the matrix demo compares the built-in remedies as they are.
DEMO_PATHS = REPO_ROOT / "traces" / "demo.paths.toml"
SCHEMAS = REPO_ROOT / "schemas"
MATRIX_CANDIDATES = ("spec-ngram", "spec-ngram-k3", "spec-ngram-fp32", "spec-draft", "spec-ngram-invariant")
# The demo's sample: the first 2 calls of each session, the first 120 of them (demo.jsonl keeps a session's calls
# together, so that is 60 of its 68 sessions, all 4 customers): enough calls for a drift rate and floor figures
# with useful intervals, and a replay a newcomer waits for on 2 CPU cores (docs/benchmarks.md: where the time
# goes). The prefill is paid once per prompt for all three decodes (the prefix cache is shared by paths on one
# model), and a session's second call reuses its first's prompt: 120 calls prefill ~18k tokens where 180 (3 per
# session) prefilled ~25k and decoded half again as many answers. One chunk of 120, so the noise floor decodes
# at twice the paths' 32 rows (a chunk of 60 would halve it to 16: slower; a kill loses the chunk, and `replay
# --resume` decodes it again).
DEMO_CALLS_PER_SESSION, DEMO_CALLS, DEMO_CHUNK = 2, 120, 120
DEMO_MAX_TOKENS = 64  # every demo answer that ends does so within 64 tokens (traces/demo.paths.toml)
# Sampled at temperature 0.7 the answers run longer: at 64, 21 and 28 of the 128 samples a side were cut (left out
# of the tests) against 11 and 18 at 96, so the sampled demo keeps 96.
DEMO_SAMPLED_MAX_TOKENS = 96
# `demo --sampled`: the first call of 8 sessions, 16 samples each per path at temperature 0.7 (docs/benchmarks.md
# has its time); the noise floor is the calibration: the target again with other seeds.
DEMO_SAMPLED_CALLS, DEMO_SAMPLES, DEMO_TEMPERATURE = 8, 16, 0.7


@dataclass(frozen=True)
class DemoChoice:
    """Which demo: the greedy one (target against spec-ngram beside the noise floor), the remedy `matrix`, or
    the `sampled` one; `limit` overrides the number of calls (the matrix: of sessions' calls)."""

    matrix: bool = False
    sampled: bool = False
    limit: int | None = None
    numerics: str = "auto"
    noise_floor: bool = True
    max_tokens: int | None = None  # None: DEMO_MAX_TOKENS (the sampled demo: DEMO_SAMPLED_MAX_TOKENS)
    samples: int = DEMO_SAMPLES


def demo_options(choice: DemoChoice) -> ReplayOptions:
    """The replay options of the chosen demo."""
    from toolaudit.replay.inputs import ReplayOptions

    if choice.sampled and choice.matrix:
        raise ValueError("the sampled demo and the matrix demo are two demos: choose one")
    max_tokens = choice.max_tokens or (DEMO_SAMPLED_MAX_TOKENS if choice.sampled else DEMO_MAX_TOKENS)
    common = dict(traces=[str(DEMO_TRACES)], baseline="target", numerics=choice.numerics, max_tokens=max_tokens,
                  schema_dir=str(SCHEMAS) if SCHEMAS.is_dir() else None)
    paths = {"paths_file": str(DEMO_PATHS)}
    if choice.sampled:
        calls = choice.limit or DEMO_SAMPLED_CALLS
        return ReplayOptions(**common, **paths, candidate="spec-ngram", limit=calls, calls_per_session=1, chunk=calls,
                             run_name="demo-sampled", noise_floor=True, temperature=DEMO_TEMPERATURE,
                             samples_per_call=choice.samples)
    if choice.matrix:
        return ReplayOptions(**common, candidate=MATRIX_CANDIDATES[0], candidates=list(MATRIX_CANDIDATES),
                             limit=choice.limit, calls_per_session=2, run_name="demo-matrix", noise_floor=False)
    return ReplayOptions(**common, **paths, candidate="spec-ngram", limit=choice.limit or DEMO_CALLS,
                         calls_per_session=DEMO_CALLS_PER_SESSION, chunk=DEMO_CHUNK, run_name="demo",
                         noise_floor=choice.noise_floor)


def demo_description(options: ReplayOptions, floor, numerics: str, cpu: str, rows: int | None = None) -> str:
    """The line the demo says before replaying: which calls, through which paths (`floor`: the noise floor's
    PathConfig, or None; `rows`: the baseline's rows decoding together), in which numerics."""
    if (options.samples_per_call or 1) > 1:
        return (f"replaying the first call of {options.limit} demo sessions, {options.samples_per_call} samples "
                f"each, at temperature {options.temperature:g} through target, spec-ngram and target-floor (other "
                "seeds: the calibration)")
    candidates = options.candidates or [options.candidate]
    floor = f" and the noise floor {floor.name} (target at {floor.batch_size} rows)" if floor else ""
    if options.candidates:
        first = f"the first {options.limit} of " if options.limit else ""
        sample = f"{first}the first {options.calls_per_session} calls of each demo session"
    else:
        sample = f"{options.limit} demo calls ({options.calls_per_session} per session)"
    at = f" at {rows} rows" if rows else ""
    return (f"replaying {sample} through target and {', '.join(candidates)}{at}{floor}, bf16 ({numerics} on CPU "
            f"{cpu})")
