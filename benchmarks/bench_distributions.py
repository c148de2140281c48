"""Cost of the sampled-run statistics (`toolaudit/compare/distributions.py`, `analysis/sampled.py`).

    python benchmarks/bench_distributions.py                    # N = 16, 2,000 calls
    python benchmarks/bench_distributions.py -n 32 --calls 5000
    python benchmarks/bench_distributions.py --zipf 16 --calls 200   # free text with repeats: 16 outcomes, Zipf

Synthetic calls: each with its own outcome distribution over 1 to 6 outcomes (Dirichlet), or with --zipf K
one Zipf distribution over K outcomes (p ~ 1/rank), both sides drawn from it. Prints ms per `call_test` (what
a sampled replay pays per call, split by whether its p-value was exact and by how many outcomes the call had),
the global test over all calls, and `sampled_summary` on a DuckDB file holding the run (what `summary` pays).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from toolaudit.analysis.sampled import sampled_summary  # noqa: E402
from toolaudit.compare import distributions as dist  # noqa: E402
from toolaudit.store import RowBuffer, Store  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=16, help="samples per side and call")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--zipf", type=int, metavar="K", help="every call Zipf over K outcomes instead")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    calls = []
    for _ in range(args.calls):
        if args.zipf:
            probs = 1 / np.arange(1, args.zipf + 1)
            probs /= probs.sum()
        else:
            probs = rng.dirichlet(np.ones(int(rng.integers(1, 7))))
        calls.append(tuple([f"f(x={i})" for i in rng.choice(len(probs), size=args.n, p=probs)] for _ in range(2)))

    times: dict[tuple[int, bool], list[float]] = defaultdict(list)
    tests = []
    start = time.perf_counter()
    for i, (b, c) in enumerate(calls):
        t0 = time.perf_counter()
        t = dist.call_test(b, c, seed=i)
        totals = np.unique(b + c, return_counts=True)[1]
        exact = dist.table_count(list(totals), len(b)) <= 9999
        times[(t.outcomes, exact)].append(time.perf_counter() - t0)
        tests.append(t)
    total = time.perf_counter() - start
    print(f"call_test, N = {args.n} a side, {args.calls} calls: {1000 * total / args.calls:.2f} ms per call "
          f"({total:.1f} s)")
    for exact in (True, False):
        ts = [t for (_, e), tt in times.items() if e is exact for t in tt]
        if ts:
            print(f"  {'exact' if exact else 'permutation_test'}: {len(ts)} calls, median "
                  f"{1000 * statistics.median(ts):.2f} ms, max {1000 * max(ts):.1f} ms")
    for (k, exact), ts in sorted(times.items()):
        if not args.zipf:
            print(f"  {k} outcomes, {'exact' if exact else 'permutation_test'}: {len(ts)} calls, median "
                  f"{1000 * statistics.median(ts):.2f} ms")
    for state in ("warm", "cold"):  # warm: the exact nulls call_test built are cached; cold: a fresh process
        if state == "cold":
            dist.clear_caches()
        t0 = time.perf_counter()
        g = dist.global_test(calls, seed=0)
        print(f"global_test, {g.calls} calls, 1,999 resamples, {state}: {time.perf_counter() - t0:.2f} s "
              f"(p = {g.p_value:.3f})")

    with tempfile.TemporaryDirectory() as tmp:
        with Store(Path(tmp) / "bench.duckdb") as store:
            run_id = store.create_run("replay", "bench", "a", "b", "t", "t", {"samples": args.n})
            buf = RowBuffer()
            for i, ((b, c), t) in enumerate(zip(calls, tests)):
                key = {"run_id": run_id, "session_id": f"s{i // 5}", "call_index": i % 5}
                for side, outcomes in (("baseline", b), ("candidate", c)):
                    for j, o in enumerate(outcomes):
                        buf.add("samples", **key, side=side, sample_index=j, outcome=o, outcome_kind="tool_call",
                                tool_name="f", arguments=f'{{"x": {o[4:-1]}}}')
                buf.add("sampled_calls", **key, customer=f"c{i % 3}", tool_name="f", **t.as_row())
            store.write_rows(buf)
            store.finish_run(run_id, {})
            dist.clear_caches()  # as `summary` starts: nothing cached
            t0 = time.perf_counter()
            s = sampled_summary(store, run_id)
            took = time.perf_counter() - t0
            print(f"sampled_summary (cold), {s['calls']} calls x {2 * args.n} samples: {took:.2f} s "
                  f"({s['shifted_calls']} shifted, global p {s['global_p']:.3f})")


if __name__ == "__main__":
    main()
