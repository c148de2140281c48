"""`toolaudit compare` on an OTel GenAI export against the same calls as an OpenAI log, side by side.

    python benchmarks/bench_formats.py                        # 100,000 OTel spans per side
    python benchmarks/bench_formats.py --spans 20000 --repeat 3
    python benchmarks/bench_formats.py --code /tmp/before      # the same files through another checkout's code

The example canary logs (traces/example_{baseline,candidate}.jsonl) are replicated, each copy's sessions
renamed, until the OTel files hold `--spans` spans per side; the same calls are written once as OpenAI logs and
once as OTel exports by the fixture writer (scripts/make_format_fixtures.py: shuffled batches of chat spans in
three attribute styles and the older event form, beside tool, agent and HTTP spans and a few spans exported
twice). Each comparison runs `python -m toolaudit compare` in a fresh process (so the peak memory of each
is its own), the two formats alternating, and prints the median seconds, CPU seconds (the process and its
workers), calls, peak resident memory of the largest process, and the OTel/OpenAI ratios; the two runs must
agree on every count. Files are generated once into --data-dir (default: a temporary folder) and reused.

On the 2-core AMD EPYC (other work running: load average 1.3-1.8), 100,000 spans per side (29,815 / 30,056
calls; OpenAI 249 MB, OTel 417 MB for both sides), median of 3 runs each:
    before (OTel converted into a temporary OpenAI log): openai 7.93 s, otel 25.97 s: 3.28x (cpu 13.6 / 31.8 s)
    after (records straight from the export):            openai 8.90 s, otel 16.63 s: 1.87x (cpu 15.0 / 30.1 s)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb

REPO = Path(__file__).resolve().parents[1]


def _fixture_writer():
    spec = importlib.util.spec_from_file_location("make_format_fixtures", REPO / "scripts/make_format_fixtures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _replicated(records: list[dict], copies: int) -> list[dict]:
    """`copies` copies of a log, each copy's sessions renamed (so every copy is a session of its own)."""
    out = []
    for k in range(copies):
        for record in records:
            record = json.loads(json.dumps(record))
            meta = record["request"]["metadata"]
            meta["session_id"] = f"{meta['session_id']}-r{k}"
            out.append(record)
    return out


def _spans(lines: list[str]) -> int:
    return sum(len(scope["spans"]) for line in lines for rs in json.loads(line)["resourceSpans"]
               for scope in rs["scopeSpans"])


def generate(out: Path, spans: int) -> dict:
    """Write openai_{side}.jsonl and otel_{side}.jsonl into `out`; returns what they hold."""
    writer = _fixture_writer()
    info: dict = {}
    for side in ("baseline", "candidate"):
        records = writer.load(REPO / f"traces/example_{side}.jsonl", None)
        per_copy = _spans(writer.build(records, "otel", random.Random(f"probe-{side}")))
        copies = max(1, round(spans / per_copy))
        many = _replicated(records, copies)
        lines = writer.build(many, "otel", random.Random(f"{writer.SEED}-bench-{side}"))
        (out / f"otel_{side}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        with open(out / f"openai_{side}.jsonl", "w", encoding="utf-8") as handle:
            for record in many:
                handle.write(writer.dumps(record) + "\n")
        info[side] = {"calls": len(many), "spans": _spans(lines), "copies": copies}
    return info


def run_compare(code: Path, baseline: Path, candidate: Path, db: Path) -> tuple[float, float, float, dict]:
    """(seconds, CPU seconds of it and its workers, peak resident MB of the largest of its processes, the run's
    counts) of one `toolaudit compare` in a fresh process."""
    if db.exists():
        db.unlink()
    cmd = [sys.executable, "-m", "toolaudit", "compare", str(baseline), str(candidate), "--db", str(db),
           "--schemas", str(REPO / "schemas")]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=code, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)  # its rusage: the maximum over it and its worker processes
        seconds = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise SystemExit(f"compare failed ({proc.returncode}):\n{err.read().decode()[-2000:]}")
    with duckdb.connect(str(db), read_only=True) as con:  # the run's counts, as stored
        (counts,) = con.execute("SELECT counts FROM runs ORDER BY run_id DESC LIMIT 1").fetchone()
    return seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, json.loads(counts)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=100_000, help="OTel spans per side (default 100,000)")
    parser.add_argument("--repeat", type=int, default=1, help="comparisons per format (median reported)")
    parser.add_argument("--code", type=Path, default=REPO, help="checkout whose toolaudit runs the comparisons")
    parser.add_argument("--data-dir", type=Path, help="where the files are generated (and reused)")
    parser.add_argument("--generate-into", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.generate_into is not None:
        info = generate(args.generate_into, args.spans)
        (args.generate_into / "info.json").write_text(json.dumps({**info, "target": args.spans}, indent=1))
        return
    with tempfile.TemporaryDirectory(prefix="bench-formats-") as tmp:
        data = args.data_dir or Path(tmp)
        data.mkdir(parents=True, exist_ok=True)
        info_file = data / "info.json"
        info = json.loads(info_file.read_text()) if info_file.exists() else None
        if info is None or info.get("target") != args.spans:
            # in a process of its own: a compare forked from a process that built big lists would count
            # that process's pages in its peak memory
            started = time.perf_counter()
            subprocess.run([sys.executable, __file__, "--spans", str(args.spans), "--generate-into", str(data)],
                           check=True)
            info = json.loads(info_file.read_text())
            print(f"generated in {time.perf_counter() - started:.1f} s")
        sizes = {fmt: sum((data / f"{fmt}_{s}.jsonl").stat().st_size for s in ("baseline", "candidate")) / 2**20
                 for fmt in ("openai", "otel")}
        print(f"code: {args.code.resolve()}")
        print(f"per side: {info['baseline']['calls']:,} / {info['candidate']['calls']:,} calls; OTel "
              f"{info['baseline']['spans']:,} / {info['candidate']['spans']:,} spans; files: OpenAI "
              f"{sizes['openai']:.0f} MB, OTel {sizes['otel']:.0f} MB (both sides)")
        times: dict[str, list[float]] = {"openai": [], "otel": []}
        cpu: dict[str, list[float]] = {"openai": [], "otel": []}
        peaks: dict[str, float] = {"openai": 0.0, "otel": 0.0}
        counts: dict[str, dict] = {}
        for _ in range(args.repeat):
            for fmt in ("openai", "otel"):
                seconds, cpu_s, peak, counts[fmt] = run_compare(args.code, data / f"{fmt}_baseline.jsonl",
                                                        data / f"{fmt}_candidate.jsonl", Path(tmp) / f"{fmt}.duckdb")
                times[fmt].append(seconds)
                cpu[fmt].append(cpu_s)
                peaks[fmt] = max(peaks[fmt], peak)
        for fmt in ("openai", "otel"):
            c = counts[fmt]
            calls = c["baseline"]["calls"] + c["candidate"]["calls"]
            print(f"{fmt:7s} {statistics.median(times[fmt]):7.2f} s  cpu {statistics.median(cpu[fmt]):6.1f} s  "
                  f"{calls:,} calls  matched {c['matched']:,}  drifted {c['drifted']:,}  peak {peaks[fmt]:.0f} MB  "
                  "(runs: "
                  + ", ".join(f"{t:.2f}" for t in times[fmt]) + ")")
        for key in ("matched", "drifted", "baseline_only", "candidate_only", "kinds"):
            if counts["openai"][key] != counts["otel"][key]:
                raise SystemExit(f"the two formats disagree on {key}: {counts['openai'][key]} vs "
                                 f"{counts['otel'][key]}")
        ratio = statistics.median(times["otel"]) / statistics.median(times["openai"])
        cpu_ratio = statistics.median(cpu["otel"]) / statistics.median(cpu["openai"])
        print(f"ratio otel/openai: {ratio:.2f}x (goal: at most 1.5x); cpu {cpu_ratio:.2f}x; load average "
              f"{os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
