"""How many threads the in-process torch engines compute with, and how their OpenMP threads wait, on a CPU that
other processes share (CI runners, laptops, a 2-core machine several jobs use).

torch's CPU build runs its parallel regions on GNU libgomp. A thread that reaches a region's end first spins
(by default for a while, then sleeps) until the last one arrives; when one of them shares its core with another
busy process, every region waits for that thread's turn on the core while the others spin. Measured on 2 cores
with one busy competitor (`benchmarks/bench_shared_cpu.py`, docs/benchmarks.md "Shared CPU"): 8 demo calls took
34 s with 1 thread and did not finish in minutes with 2. So, unless the user said otherwise:

- threads: the cores this process may use minus those other processes keep busy, measured over a short window
  of /proc/stat (`WINDOW_S`) and again before a decode when the last measure is older than `REFRESH_S`, never
  below 1 (`choose`): a competitor present when a chunk of a replay starts gets its core, and with one thread
  there is no barrier to spin at. A path's `threads` key, then $OMP_NUM_THREADS, win over it.
- OMP_WAIT_POLICY=passive, opt-in with TOOLAUDIT_PASSIVE_WAIT=1 (`quiet_openmp`): threads that wait sleep at
  once instead of spinning, so a competitor that starts in the middle of a chunk costs its share of the CPU,
  not a stall. Not the default: on a quiet 2-core machine it cost the embedded engine 30-40% (float32 target
  17.4 -> 12.2 tokens/s at batch 1, 48.5 -> 37.9 at batch 8, `bench_engine.py` side by side), more than the
  15-20% an 8-call replay showed. libgomp reads the variable once, when torch loads it, so this runs when
  `toolaudit.engines` is imported (every torch import of the package comes after it), and only where the user
  set neither it nor GOMP_SPINCOUNT. Short spins (GOMP_SPINCOUNT=1000, 10000) were slower or stalled as well.

The count is not numerics: the fingerprint names the configured count, or the cores the process may use when
none is configured (what it named before this choice existed), never the momentary load (see `LocalEngine`).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Any

WINDOW_S = 0.2  # long enough for 20 ticks per core at /proc/stat's 100 Hz
REFRESH_S = 10.0  # a choice older than this is measured again before the next decode
OPT_IN = "TOOLAUDIT_PASSIVE_WAIT"
POLICY = {"OMP_WAIT_POLICY": "passive"}
_USER_KNOBS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
_set_by_us: dict[str, str] = {}
_made: dict[ThreadChoice, None] = {}  # an ordered set
_torch_first = False  # torch (and so libgomp) was loaded before toolaudit.engines: too late to set a policy


def quiet_openmp() -> None:
    """Set `POLICY` in the environment when asked to (TOOLAUDIT_PASSIVE_WAIT=1) unless the user set a wait
    policy or torch is already loaded."""
    global _torch_first
    if os.environ.get(OPT_IN) != "1" or any(k in os.environ for k in _USER_KNOBS) or _set_by_us:
        return
    if "torch" in sys.modules:
        _torch_first = True
        return
    os.environ.update(POLICY)
    _set_by_us.update(POLICY)


def set_by_toolaudit() -> dict[str, str]:
    """The environment variables `quiet_openmp` set (engines that spawn their own OpenMP processes, e.g. vLLM
    with threads bound to cores, spawn them without these)."""
    return dict(_set_by_us)


def wait_policy() -> str:
    """The wait policy libgomp runs with, in words for the user."""
    if "OMP_WAIT_POLICY" in os.environ:
        origin = "" if _set_by_us else " (yours)"
        return f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}{origin}"
    if "GOMP_SPINCOUNT" in os.environ:
        return f"GOMP_SPINCOUNT={os.environ['GOMP_SPINCOUNT']} (yours)"
    return ("OMP_WAIT_POLICY unset (torch loaded before toolaudit)" if _torch_first
            else "libgomp's default wait (spins; TOOLAUDIT_PASSIVE_WAIT=1 for passive)")


@dataclass(frozen=True)
class ThreadChoice:
    """The threads a path computes with and why."""

    threads: int
    source: str  # "threads key", "OMP_NUM_THREADS" or "free cores"
    cores: int  # cores this process may run on
    busy: int | None = None  # of those, busy with other processes (measured only for "free cores")

    def line(self) -> str:
        """E.g. "torch threads: 1 (2 cores, 1 busy; OMP_WAIT_POLICY=passive)"."""
        why = f"{self.cores} cores, {self.busy} busy" if self.busy is not None else f"{self.source}"
        return f"torch threads: {self.threads} ({why}; {wait_policy()})"


def available_cores() -> int:
    """The cores this process may run on (its affinity mask: a container or taskset may allow fewer than exist)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def choose(configured: int | None) -> ThreadChoice:
    """A path's `threads` key, else $OMP_NUM_THREADS, else the free cores (measured again after `REFRESH_S`)."""
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if configured:
        choice = ThreadChoice(configured, "threads key", available_cores())
    elif env.isdigit() and int(env) > 0:
        choice = ThreadChoice(int(env), "OMP_NUM_THREADS", available_cores())
    else:
        choice = _free_cores()
    _made.setdefault(choice, None)
    return choice


def choices() -> list[ThreadChoice]:
    """The distinct choices this process made, first first (a command prints their lines once, at its end)."""
    return list(_made)


def summary_line() -> str | None:
    """The choices this process made as one line (a command's last word on threads), or None when it made none:
    the one choice's line, or e.g. "torch threads: 1-2 over the run (2 cores, 0-1 busy when measured; ...)" when
    a free-core choice was measured again between chunks and changed."""
    made = choices()
    if len(made) <= 1:
        return made[0].line() if made else None
    counts = sorted({c.threads for c in made})
    busy = sorted({c.busy for c in made if c.busy is not None})
    span = lambda values: f"{values[0]}-{values[-1]}" if len(values) > 1 else str(values[0])  # noqa: E731
    why = [f"{span(sorted({c.cores for c in made}))} cores"]
    if busy:
        why.append(f"{span(busy)} busy when measured")
    why += sorted({c.source for c in made if c.busy is None})
    return f"torch threads: {span(counts)} over the run ({', '.join(why)}; {wait_policy()})"


_last: dict[str, Any] = {}  # the last free-core choice ("choice") and when it was measured ("at", monotonic s)


def _free_cores() -> ThreadChoice:
    """The free-core choice, measured again when the last one is older than `REFRESH_S`."""
    if _last and time.monotonic() - _last["at"] <= REFRESH_S:
        return _last["choice"]
    cores = _allowed()
    busy = measure_busy(cores)
    count = len(cores)
    choice = ThreadChoice(free_threads(count, busy), "free cores", count, None if busy is None else round_busy(busy))
    _last.update(choice=choice, at=time.monotonic())
    return choice


def free_threads(cores: int, busy: float | None) -> int:
    """Cores minus those busy with other processes (a core counts as busy from half its time), at least 1."""
    if busy is None:
        return cores
    return max(1, cores - round_busy(busy))


def round_busy(busy: float) -> int:
    return int(busy + 0.5)


def measure_busy(cores: set[int], window: float = WINDOW_S) -> float | None:
    """How many of `cores` other processes kept busy over `window` seconds (this process's own CPU time taken
    out); None where /proc/stat cannot be read."""
    try:
        before, own_before = read_stat(), _own_seconds()
        time.sleep(window)
        after, own_after = read_stat(), _own_seconds()
    except OSError:
        return None
    return busy_cores(cpu_ticks(before, cores), cpu_ticks(after, cores), own_after - own_before, len(cores))


def read_stat() -> str:
    with open("/proc/stat", encoding="ascii") as f:
        return f.read()


def cpu_ticks(stat: str, cores: set[int]) -> tuple[int, int]:
    """(busy, total) ticks of `cores` in a /proc/stat text. Busy: user, nice, system, irq, softirq and steal
    (a hypervisor giving the core to someone else); idle and iowait are free."""
    busy = total = 0
    for line in stat.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cores:
            continue
        fields = [int(v) for v in rest.split()[:8]] + [0] * 8
        user, nice, system, idle, iowait, irq, softirq, steal = fields[:8]
        spent = user + nice + system + irq + softirq + steal
        busy += spent
        total += spent + idle + iowait
    return busy, total


def busy_cores(before: tuple[int, int], after: tuple[int, int], own_seconds: float, cores: int,
               hz: int = 100) -> float:
    """Cores' worth of CPU time others used between two samples (/proc/stat counts in 1/100 s, USER_HZ)."""
    total = after[1] - before[1]
    if total <= 0 or cores <= 0:
        return 0.0
    others = (after[0] - before[0]) - own_seconds * hz
    return min(float(cores), max(0.0, others / (total / cores)))


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system


def _allowed() -> set[int]:
    try:
        return set(os.sched_getaffinity(0)) or {0}
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))
