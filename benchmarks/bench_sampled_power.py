"""Power and calibration of sampled replays on the field's broken speculative samplers.

Each sampler of `tests/plugins/toolaudit-broken-samplers` (installed with pip into a temporary directory, found
through its `toolaudit.engines` entry point like any plug-in) is a candidate of one remedy matrix against the
torch engine's target at temperature > 0, with the correct rejection sampler (n-gram and draft-model) and the
target against itself with other seeds (the calibration row: the noise-floor path) beside them. Every path
decodes the same demo calls N times; the table is each candidate's global p, the calls flagged under BH at
q = 0.05 and the median TV distance. A broken sampler must be flagged (global p < 0.01); the correct ones and the
calibration must not. Each row prints the candidate's acceptance: a bug in the draft or the verification
acts only through proposals, so a draft whose proposals are almost all rejected hides it (`--draft`).

    python benchmarks/bench_sampled_power.py [--calls 24] [--samples 16] [--temperature 0.7] [--top-p 0.9]
        [--draft smollm2-135m:first29] [--candidate NAME ...] [--db keep.duckdb]

`tests/analysis/test_sampled_power.py` runs the same table on fewer calls in `make test`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLUGIN = REPO / "tests" / "plugins" / "toolaudit-broken-samplers"
DEMO = REPO / "traces" / "demo.jsonl"
# The draft of the draft-model rows (`--draft`): a draft bug shows only through the proposals it gets accepted.
# Measured at temperature 0.7 (CPU, float32): the demo's early-exit draft `:first8` has under 1% of its proposals
# accepted, `:first26` 21%, `:first28` 30%, `:first29` 40%, and the target as its own draft 100%, the one where
# a draft bug reaches every token (docs/benchmarks.md has the table at each).
DRAFT_MODEL = "smollm2-135m"


def draft_spec(model: str) -> str:
    return f'{{ method = "draft_model", num_speculative_tokens = 3, model = "{model}" }}'


NGRAM = '{ method = "ngram", num_speculative_tokens = 5, prompt_lookup_min = 1, prompt_lookup_max = 4 }'
DRAFT = "draft"  # stands for draft_spec(--draft) in CANDIDATES
# candidate path -> (engine's bug, speculation, must be flagged)
CANDIDATES = {
    "correct-ngram": ("none", NGRAM, False),
    "correct-draft": ("none", DRAFT, False),
    "target-unwarped": ("target_unwarped", NGRAM, True),
    "equality-verify": ("equality", NGRAM, True),
    "argmax-verify": ("argmax", NGRAM, True),
    "draft-temperature": ("draft_temperature", DRAFT, True),
}


@dataclass(frozen=True)
class Row:
    sampler: str
    must_flag: bool
    calls: int
    samples: int
    global_p: float | None
    flagged: int
    median_tv: float | None
    acceptance: float | None = None  # the candidate's share of proposals accepted (None: no speculation)

    @property
    def caught(self) -> bool:
        return self.global_p is not None and self.global_p < 0.01


def install_plugin(into: Path) -> Path:
    """The plug-in built and installed by pip (from a copy: an in-tree build leaves build/ and egg-info)."""
    source, site = into / "src", into / "site"
    shutil.copytree(PLUGIN, source)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--disable-pip-version-check", "--target", str(site), str(source)],
                   check=True, capture_output=True, timeout=300)
    return site


def paths_toml(temperature: float, top_p: float, max_tokens: int, batch: int, dtype: str, device: str = "cpu",
               draft: str = DRAFT_MODEL) -> str:
    common = (f'dtype = "{dtype}"\ntemperature = {temperature}\ntop_p = {top_p}\nmax_tokens = {max_tokens}\n'
              f'batch_size = {batch}\ndevice = "{device}"\n')
    text = f'[paths.target]\nengine = "torch"\n{common}\n'
    for name, (bug, spec, _) in CANDIDATES.items():
        spec = draft_spec(draft) if spec == DRAFT else spec
        text += f'[paths.{name}]\nengine = "torch-broken"\nbug = "{bug}"\n{common}speculative = {spec}\n\n'
    return text


def power_table(workdir: Path, calls: int, samples: int, temperature: float = 0.7, top_p: float = 0.9,
                max_tokens: int = 64, dtype: str = "float32", candidates: list[str] | None = None,
                device: str = "cpu", db: Path | None = None, draft: str = DRAFT_MODEL,
                batch: int | None = None) -> tuple[list[Row], float]:
    """Replay the matrix and read each candidate's sampled figures; returns the rows and the replay's seconds.
    `db` keeps the database (every sample of every path) for a later look; by default it lives in `workdir`.
    `batch`: rows decoded together (default max(16, samples)); a small run decodes fastest with all its
    calls' samples in one batch (no short last batch paying a step's fixed cost for a few rows)."""
    from toolaudit.analysis.floor import is_noise_floor
    from toolaudit.analysis.sampled import sampled_summary
    from toolaudit.store import Store

    names = candidates or list(CANDIDATES)
    site = install_plugin(workdir)
    paths = workdir / "paths.toml"
    paths.write_text(paths_toml(temperature, top_p, max_tokens, batch=batch or max(16, samples), dtype=dtype,
                                device=device, draft=draft))
    db = db or workdir / "power.duckdb"
    args = [sys.executable, "-m", "toolaudit", "replay", str(DEMO), "--paths", str(paths), "--baseline", "target",
            *[a for n in [*names, "target"] for a in ("--candidate", n)], "--samples", str(samples),
            "--limit", str(calls), "--calls-per-session", "1", "--db", str(db), "--run-name", "power",
            "--as", "json"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(REPO)]), TOOLAUDIT_NO_PROBE="1")
    start = time.perf_counter()
    done = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"replay failed ({done.returncode}):\n{done.stderr[-3000:]}")
    rows = []
    with Store(db, read_only=True) as store:
        matrix = store.run_row(None)
        for member in store.matrix_members(matrix["run_id"]):
            s = sampled_summary(store, member["run_id"])
            floor = is_noise_floor(member)
            name = "calibration (target, other seeds)" if floor else member["candidate_name"]
            must = False if floor else CANDIDATES[member["candidate_name"]][2]
            acceptance = s["candidate_acceptance"] and s["candidate_acceptance"]["rate"]
            rows.append(Row(name, must, s["calls_tested"], s["samples_per_call"], s["global_p"], s["shifted_calls"],
                            s["median_tv"], acceptance))
    return rows, seconds


def format_table(rows: list[Row]) -> str:
    lines = [f"{'sampler':<36} {'calls':>5} {'N':>3} {'global p':>9} {'flagged':>7} {'median TV':>9} "
             f"{'accepted':>8}  verdict"]
    for r in rows:
        p = "-" if r.global_p is None else f"{r.global_p:.4f}"
        tv = "-" if r.median_tv is None else f"{r.median_tv:.3f}"
        accepted = "-" if r.acceptance is None else f"{r.acceptance:.1%}"
        verdict = ("caught" if r.caught else "MISSED") if r.must_flag else ("FLAGGED" if r.caught else "not flagged")
        lines.append(f"{r.sampler:<36} {r.calls:>5} {r.samples:>3} {p:>9} {r.flagged:>7} {tv:>9} {accepted:>8}  "
                     f"{verdict}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=24)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--candidate", action="append", help="only these candidates (repeat)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--draft", default=DRAFT_MODEL, help=f"the draft-model rows' draft (default {DRAFT_MODEL})")
    ap.add_argument("--db", type=Path, help="keep the replay's database here (every sample of every path)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows, seconds = power_table(Path(tmp), a.calls, a.samples, a.temperature, a.top_p, a.max_tokens, a.dtype,
                                    a.candidate, a.device, a.db, a.draft)
    print(f"demo calls {a.calls} (first call of each session), N = {a.samples} per path, temperature "
          f"{a.temperature}, top_p {a.top_p}, {a.dtype}, max_tokens {a.max_tokens}, {a.device}, draft {a.draft}; "
          f"replay {seconds:.0f} s")
    print(format_table(rows))


if __name__ == "__main__":
    main()
