"""What one busy competitor process costs a replay, per thread setting (issue 22 item 7: "no cliff on a shared CPU").

    .venv/bin/python benchmarks/bench_shared_cpu.py [--calls 8] [--timeout 240] [--rounds 1] [--settings ...]

Each run is a fresh subprocess that replays the first N demo calls through the float32 target and spec-ngram
paths on the torch engine (library API, as `bench_engine.py` does; one shared prefix cache, as `replay` has) and
reports the engine time (model load excluded). A run is done quiet, then with one competitor process
(`python -c "while True: pass"`, started just before the run and killed after it) - quiet and busy alternate, so
other jobs on a shared machine hit both about equally, but a "quiet" figure is only as quiet as the machine was.
A run past `--timeout` seconds is killed and reported as "did not finish in T s".
`--compare-threads float32,bfloat16` instead checks whether the thread count is numerics: the same calls on 1 and
2 threads, token ids and margins compared (the fingerprint does not name the count in use).

Settings (`--settings`, comma-separated):
  t2-spin      threads = 2, libgomp's default wait (threads spin 300,000 rounds before they sleep): GOMP_SPINCOUNT
               set to that default, so toolaudit (which leaves a user's wait settings alone) sets no policy
  t2-passive   threads = 2, OMP_WAIT_POLICY=passive (waiting threads sleep at once)
  t2-spin10k   threads = 2, GOMP_SPINCOUNT=10000 (a short spin, then sleep)
  t2-spin1k    threads = 2, GOMP_SPINCOUNT=1000 (what libgomp uses itself when it has more threads than cores)
  t1           threads = 1
  default      no `threads` key and nothing in the environment: what toolaudit chooses itself
Environment variables the benchmark sets are set in the child's environment, before Python (and libgomp) start;
for the others the child's environment has OMP_WAIT_POLICY, GOMP_SPINCOUNT and OMP_NUM_THREADS removed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SETTINGS = {  # name -> (threads key or None, environment for the child)
    "t2-spin": (2, {"GOMP_SPINCOUNT": "300000"}),  # libgomp's default spin with no policy set, pinned
    "t2-passive": (2, {"OMP_WAIT_POLICY": "passive"}),
    "t2-spin10k": (2, {"GOMP_SPINCOUNT": "10000"}),
    "t2-spin1k": (2, {"GOMP_SPINCOUNT": "1000"}),  # libgomp's own count when it has more threads than cores
    "t1": (1, {}),
    "default": (None, {}),
}
CLEARED = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")


def child(calls: int, threads: int | None, dtype: str = "float32", dump: Path | None = None) -> None:
    """Replay `calls` demo calls through target and spec-ngram; print one JSON line of figures (and write each
    result's token ids and margins to `dump`)."""
    from toolaudit.engines.base import EngineRequest
    from toolaudit.engines.paths import builtin_paths
    from toolaudit.engines.torch.engine import TorchEngine

    rows = [json.loads(line) for line in (ROOT / "traces" / "demo.jsonl").read_text().splitlines() if line.strip()]
    requests = [EngineRequest(key=f"demo-{i}", messages=r["request"]["messages"], tools=r["request"].get("tools", []))
                for i, r in enumerate(rows[:calls])]
    options = {} if threads is None else {"threads": threads}
    paths = builtin_paths()
    engines = [TorchEngine(replace(paths[name], dtype=dtype, options=options)) for name in ("target", "spec-ngram")]
    for engine in engines:
        engine.load()
    import torch

    from toolaudit.engines.threads import choices

    start = time.perf_counter()
    results = [r for engine in engines for r in engine.generate(requests)]
    seconds = time.perf_counter() - start
    errors = [r.error for r in results if r.error]
    for choice in choices():
        print(choice.line(), flush=True)
    if dump is not None:
        dump.write_text(json.dumps([{"key": r.key, "ids": r.token_ids, "margins": r.margins} for r in results]))
    print(json.dumps({"seconds": seconds, "errors": errors[:1], "threads": torch.get_num_threads(),
                      "wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                      "tokens": sum(len(r.token_ids) for r in results)}), flush=True)


def run_once(setting: str, calls: int, timeout: float, busy: bool) -> dict:
    """One child run of `setting`, with or without a competitor; {"seconds": None} when it timed out."""
    threads, extra = SETTINGS[setting]
    env = {k: v for k, v in os.environ.items() if k not in CLEARED} | extra
    command = [sys.executable, __file__, "--child", "--calls", str(calls)]
    if threads is not None:
        command += ["--threads", str(threads)]
    competitor = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return {"seconds": None}
    finally:
        if competitor is not None:
            competitor.kill()
            competitor.wait()
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{setting}: child failed ({proc.returncode}): {err.strip()[-800:]}")
    figures = json.loads(lines[-1])
    figures["choice"] = next((line for line in (out + err).splitlines() if line.startswith("torch threads:")), None)
    return figures


def compare_threads(calls: int, dtypes: list[str], out: Path) -> None:
    """Whether the thread count is numerics: the same calls on 1 and 2 threads, token ids and margins compared."""
    out.mkdir(parents=True, exist_ok=True)
    for dtype in dtypes:
        runs = {}
        for threads in (1, 2):
            dump = out / f"{dtype}-t{threads}.json"
            subprocess.run([sys.executable, __file__, "--child", "--calls", str(calls), "--threads", str(threads),
                            "--dtype", dtype, "--dump", str(dump)], check=True, capture_output=True)
            runs[threads] = json.loads(dump.read_text())
        one, two = runs[1], runs[2]
        same_ids = sum(a["ids"] == b["ids"] for a, b in zip(one, two))
        same_margins = sum(a["margins"] == b["margins"] for a, b in zip(one, two))
        print(f"{dtype}: {calls} calls x 2 paths; token ids equal on 1 and 2 threads: {same_ids}/{len(one)}; "
              f"margins bit-equal: {same_margins}/{len(one)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=240.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--cases", default="quiet,busy", help="quiet, busy or both (alternating)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--compare-threads", metavar="DTYPES",
                        help="instead: compare token ids on 1 and 2 threads for these dtypes (float32,bfloat16)")
    parser.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    parser.add_argument("--dump", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.calls, args.threads, args.dtype, args.dump)
        return
    if args.compare_threads:
        compare_threads(args.calls, args.compare_threads.split(","), Path("/tmp/bench_shared_cpu"))
        return
    settings = args.settings.split(",")
    results: dict[str, dict[str, list]] = {s: {"quiet": [], "busy": []} for s in settings}
    for round_ in range(args.rounds):
        for setting in settings:
            for busy in [case == "busy" for case in args.cases.split(",")]:  # alternating: other jobs hit both alike
                figures = run_once(setting, args.calls, args.timeout, busy)
                results[setting]["busy" if busy else "quiet"].append(figures)
                shown = "did not finish" if figures["seconds"] is None else f"{figures['seconds']:.1f} s"
                print(f"round {round_ + 1} {setting:<11} {'busy' if busy else 'quiet':<5} {shown}"
                      f"{'  [' + figures['choice'] + ']' if figures.get('choice') else ''}", flush=True)
    print(f"\n{args.calls} demo calls, float32 target + spec-ngram, torch engine; best of {args.rounds} round(s); "
          f"load {os.getloadavg()[0]:.2f} at the end")
    print("| setting | quiet s | one busy competitor s | busy / quiet |\n|---|---|---|---|")
    for setting in settings:
        best = {case: min((f["seconds"] for f in runs if f["seconds"] is not None), default=None)
                for case, runs in results[setting].items()}
        cell = {case: "-" if not results[setting][case] else f"{v:.1f}" if v is not None
                else f"did not finish in {args.timeout:.0f} s" for case, v in best.items()}
        ratio = f"{best['busy'] / best['quiet']:.2f}x" if best["busy"] and best["quiet"] else "-"
        print(f"| {setting} | {cell['quiet']} | {cell['busy']} | {ratio} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
