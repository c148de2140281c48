"""Throughput of compare + store end to end, and the same work done naively, side by side.

    python benchmarks/bench_analysis.py                 # N = 1,000,000 pairs, naive loop on 20,000
    python benchmarks/bench_analysis.py -n 100000 --naive-n 5000
    python benchmarks/bench_analysis.py -n 1000000 --flat 3000000 --naive-n 0 --keep DIR   # RSS from 1M to 3M

Synthetic pairs: 1% drifted (value, type, missing, added, tool name), realistic argument sizes (nested
filters, lists, free-text fields of 40-400 characters), a few tools with JSON Schemas, multi-turn context.
The naive loop is what a first version would do: json.loads, jsonschema.validate per side, DeepDiff per
pair, one INSERT per call.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import jsonschema
import orjson
from deepdiff import DeepDiff

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from toolaudit.compare.logs import CompareOptions, compare_logs  # noqa: E402
from toolaudit.store import Store  # noqa: E402

TOOLS = [
    {"type": "function", "function": {
        "name": "search_orders", "description": "Search a customer's orders by status and date range.",
        "parameters": {"type": "object", "properties": {
            "customer_id": {"type": "integer"}, "limit": {"type": "integer", "minimum": 1, "maximum": 500},
            "filters": {"type": "object", "properties": {
                "status": {"type": "array", "items": {"type": "string", "enum": ["open", "shipped", "returned"]}},
                "since": {"type": "string"}, "until": {"type": "string"}}},
            "sort": {"type": "string", "enum": ["asc", "desc"]}},
            "required": ["customer_id", "limit"]}}},
    {"type": "function", "function": {
        "name": "send_email", "description": "Send an email to a customer.",
        "parameters": {"type": "object", "properties": {
            "to": {"type": "string"}, "subject": {"type": "string"}, "body": {"type": "string"},
            "cc": {"type": "array", "items": {"type": "string"}}}, "required": ["to", "subject", "body"]}}},
    {"type": "function", "function": {
        "name": "update_ticket", "description": "Update a support ticket.",
        "parameters": {"type": "object", "properties": {
            "ticket_id": {"type": "integer"}, "priority": {"type": "string", "enum": ["low", "medium", "high"]},
            "note": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
            "required": ["ticket_id"]}}},
]
WORDS = ("order refund shipped customer delayed package invoice account billing warehouse tracking update "
         "request priority escalate confirm address payment").split()


def _text(rng: random.Random, lo: int, hi: int) -> str:
    out, n = [], rng.randint(lo, hi)
    while sum(len(w) + 1 for w in out) < n:
        out.append(rng.choice(WORDS))
    return " ".join(out)


def _arguments(rng: random.Random, tool: str) -> dict:
    if tool == "search_orders":
        return {"customer_id": rng.randint(1000, 99999), "limit": rng.choice([5, 10, 20, 50, 100]),
                "filters": {"status": rng.sample(["open", "shipped", "returned"], rng.randint(1, 3)),
                            "since": f"2026-{rng.randint(1, 12):02d}-01", "until": "2026-12-31"},
                "sort": rng.choice(["asc", "desc"])}
    if tool == "send_email":
        return {"to": f"user{rng.randint(1, 10**6)}@example.com", "subject": _text(rng, 20, 60),
                "body": _text(rng, 120, 400), "cc": [f"cc{rng.randint(1, 99)}@example.com"]}
    return {"ticket_id": rng.randint(1, 10**6), "priority": rng.choice(["low", "medium", "high"]),
            "note": _text(rng, 40, 200), "tags": rng.sample(WORDS, 3)}


def _drift(rng: random.Random, tool: str, args: dict) -> tuple[str, dict]:
    args = json.loads(json.dumps(args))
    kind = rng.choice(["value", "type", "missing", "added", "name"])
    key = next(iter(args))
    if kind == "value":
        args[key] = args[key] * 10 if isinstance(args[key], int) else str(args[key]) + "x"
    elif kind == "type":
        args[key] = len(args[key]) if isinstance(args[key], str) else str(args[key])
    elif kind == "missing":
        del args[key]
    elif kind == "added":
        args["unexpected"] = True
    else:
        tool = {"search_orders": "update_ticket", "send_email": "search_orders"}.get(tool, "send_email")
    return tool, args


def generate(n: int, out_dir: Path, drift_rate: float = 0.01, seed: int = 1) -> tuple[Path, Path]:
    """Write n baseline/candidate line pairs; ~drift_rate of candidates drifted, the rest reformatted."""
    rng = random.Random(seed)
    b_path, c_path = out_dir / "baseline.jsonl", out_dir / "candidate.jsonl"
    with b_path.open("wb") as bf, c_path.open("wb") as cf:
        for i in range(n):
            session, index = f"sess-{i // 5}", i % 5
            tool = rng.choice(TOOLS)["function"]["name"]
            args = _arguments(rng, tool)
            request = {
                "model": "prod-8b", "temperature": 0,
                "messages": [{"role": "system", "content": "You are a support agent. Use tools."},
                             {"role": "user", "content": _text(rng, 60, 240)}],
                "tools": TOOLS,
                "metadata": {"session_id": session, "customer": f"cust-{(i // 5) % 7}", "call_index": str(index)},
            }

            def record(name: str, arguments: dict, pretty: bool, i: int = i, request: dict = request) -> bytes:
                text = json.dumps(arguments, indent=1, sort_keys=True) if pretty else json.dumps(arguments)
                message = {"role": "assistant", "content": None, "tool_calls": [
                    {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": text}}]}
                return orjson.dumps({"request": request, "response": {
                    "id": f"r{i}", "object": "chat.completion", "model": "prod-8b",
                    "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}}) + b"\n"

            bf.write(record(tool, args, False))
            if rng.random() < drift_rate:
                cf.write(record(*_drift(rng, tool, args), False))
            else:
                cf.write(record(tool, args, True))  # reformatted: same call, not drift
    return b_path, c_path


def _generated(n: int, out_dir: Path) -> tuple[Path, Path]:
    """generate() once per folder: a kept folder is reused when it holds the files for the same n."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = out_dir / "n.txt"
    if stamp.exists() and stamp.read_text() == str(n):
        return out_dir / "baseline.jsonl", out_dir / "candidate.jsonl"
    paths = generate(n, out_dir)
    stamp.write_text(str(n))
    return paths


def run_fast(b: Path, c: Path, db: Path) -> tuple[float, dict]:
    db.unlink(missing_ok=True)
    start = time.perf_counter()
    with Store(db) as store:
        _, counts = compare_logs(store, b, c, CompareOptions(schema_dir=None))
    return time.perf_counter() - start, counts.as_dict()


def run_naive(b: Path, c: Path, db: Path, limit: int) -> tuple[float, int]:
    """The obvious loop: parse, validate each side, DeepDiff, INSERT one row per call."""
    db.unlink(missing_ok=True)
    start = time.perf_counter()
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE calls (session_id VARCHAR, call_index INTEGER, drifted BOOLEAN, "
                "b_valid BOOLEAN, c_valid BOOLEAN, diff VARCHAR)")
    drifted = 0
    with b.open() as bf, c.open() as cf:
        for n, (bl, cl) in enumerate(zip(bf, cf)):
            if n >= limit:
                break
            brec, crec = json.loads(bl), json.loads(cl)
            schemas = {t["function"]["name"]: t["function"]["parameters"] for t in brec["request"]["tools"]}
            bcall = brec["response"]["choices"][0]["message"]["tool_calls"][0]["function"]
            ccall = crec["response"]["choices"][0]["message"]["tool_calls"][0]["function"]
            bargs, cargs = json.loads(bcall["arguments"]), json.loads(ccall["arguments"])
            valid = []
            for name, args in ((bcall["name"], bargs), (ccall["name"], cargs)):
                try:
                    jsonschema.validate(args, schemas[name])
                    valid.append(True)
                except jsonschema.ValidationError:
                    valid.append(False)
            diff = DeepDiff({"name": bcall["name"], "args": bargs}, {"name": ccall["name"], "args": cargs})
            drifted += bool(diff)
            meta = brec["request"]["metadata"]
            con.execute("INSERT INTO calls VALUES (?, ?, ?, ?, ?, ?)",
                        [meta["session_id"], int(meta["call_index"]), bool(diff), valid[0], valid[1],
                         diff.to_json() if diff else None])
    con.close()
    return time.perf_counter() - start, drifted


def end_to_end(n: int, work: Path) -> dict:
    """One compare + store of n generated pairs in this process: time, rate, drift and this process's peak RSS."""
    t0 = time.perf_counter()
    b, c = _generated(n, work / f"n{n}")
    gen_s = time.perf_counter() - t0
    load = os.getloadavg()[0]
    elapsed, counts = run_fast(b, c, work / "big.duckdb")
    return {"n": n, "seconds": elapsed, "pairs_per_s": n / elapsed, "drifted": counts["drifted"],
            "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "worker_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
            "jsonl_mb": (b.stat().st_size + c.stat().st_size) / 1e6, "generated_s": gen_s,
            "db_mb": (work / "big.duckdb").stat().st_size / 1e6, "load_before": load, "load_after": os.getloadavg()[0]}


def _print_run(run: dict) -> None:
    n = run["n"]
    print(f"\nend to end on {n:,} pairs ({run['jsonl_mb']:,.0f} MB of JSONL, generated in {run['generated_s']:.0f} s):")
    print(f"  compare + store: {run['seconds']:.1f} s = {run['pairs_per_s']:,.0f} pairs/s; "
          f"{run['drifted']:,} drifted ({run['drifted'] / n:.2%}); peak RSS {run['rss_mb']:,.0f} MB "
          f"(largest worker {run['worker_mb']:,.0f} MB); db {run['db_mb']:,.0f} MB")
    print(f"  cores {os.cpu_count()} ({_cpu()}); load average {run['load_before']:.2f} before, "
          f"{run['load_after']:.2f} after")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=1_000_000, help="call pairs for the end-to-end run")
    parser.add_argument("--naive-n", type=int, default=20_000,
                        help="call pairs for the side-by-side comparison (0: skip it)")
    parser.add_argument("--keep", type=Path, help="keep generated files in this folder (and reuse them)")
    parser.add_argument("--flat", type=int, metavar="N2",
                        help="also run N2 pairs; each size runs in a fresh process so its peak RSS is its own, and "
                             "the RSS growth from -n to N2 is printed (issue 24: flat from 1M to 3M)")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child of --flat: one run, as JSON
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="toolaudit-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.one:
        print(json.dumps(end_to_end(args.one, work)))
        return

    if args.naive_n:
        small = work / "small"
        small.mkdir(exist_ok=True)
        sb, sc = _generated(args.naive_n, small)
        naive_s, naive_drifted = run_naive(sb, sc, small / "naive.duckdb", args.naive_n)
        fast_s, fast_counts = run_fast(sb, sc, small / "fast.duckdb")
        print(f"side by side on {args.naive_n:,} pairs:")
        print(f"  naive loop (json + jsonschema.validate + DeepDiff + INSERT per call): {naive_s:8.2f} s "
              f"{args.naive_n / naive_s:10,.0f} pairs/s  ({naive_drifted} differ)")
        print(f"  toolaudit compare + store:                                           {fast_s:8.2f} s "
              f"{args.naive_n / fast_s:10,.0f} pairs/s  ({fast_counts['drifted']} drifted)")
        print(f"  speedup: {naive_s / fast_s:.1f}x")

    if not args.flat:
        _print_run(end_to_end(args.n, work))
        return
    runs = []
    for n in (args.n, args.flat):
        out = subprocess.run([sys.executable, __file__, "--one", str(n), "--keep", str(work)], check=True,
                             capture_output=True, text=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
        _print_run(runs[-1])
    a, b = runs
    print(f"\nfrom {a['n']:,} to {b['n']:,} pairs: peak RSS {a['rss_mb']:,.0f} -> {b['rss_mb']:,.0f} MB "
          f"({b['rss_mb'] / a['rss_mb']:.2f}x for {b['n'] / a['n']:.0f}x the pairs); "
          f"pairs/s {a['pairs_per_s']:,.0f} -> {b['pairs_per_s']:,.0f}")


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            info = handle.read()
    except OSError:
        return "unknown CPU"
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "?")
    flags = next((ln for ln in info.splitlines() if ln.startswith("flags")), "")
    return name + (", AVX-512" if "avx512f" in flags else "")


if __name__ == "__main__":
    main()
