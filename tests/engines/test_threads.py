"""The thread count and OpenMP wait policy of in-process engines on a shared CPU (`toolaudit.engines.threads`):
the choice from /proc/stat samples, the explicit settings that win over it, and the policy set before torch
loads, only where the user set none."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from toolaudit.engines import threads


def stat(*cpus: tuple[int, int, int, int]) -> str:
    """A /proc/stat text: per core (user, system, idle, steal) ticks, the other fields zero."""
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
    for i, (user, system, idle, steal) in enumerate(cpus):
        lines.append(f"cpu{i} {user} 0 {system} {idle} 0 0 0 {steal} 0 0")
    return "\n".join([*lines, "intr 1 2 3", "ctxt 99", "procs_running 3"]) + "\n"


CORES = {0, 1}
BEFORE = stat((1000, 100, 5000, 0), (2000, 200, 4000, 0))


@pytest.mark.parametrize(("after", "own_s", "busy", "threads_"), [
    (stat((1000, 100, 5020, 0), (2000, 200, 4020, 0)), 0.0, 0.0, 2),  # quiet
    (stat((1020, 100, 5000, 0), (2000, 200, 4020, 0)), 0.0, 1.0, 1),  # one core busy with someone else
    (stat((1020, 100, 5000, 0), (2000, 200, 4020, 0)), 0.2, 0.0, 2),  # ... with this process itself
    (stat((1010, 110, 5000, 0), (2018, 202, 4000, 0)), 0.0, 2.0, 1),  # both busy: never below 1
    (stat((1000, 100, 5000, 20), (2000, 200, 4020, 0)), 0.0, 1.0, 1),  # the hypervisor gave a core away (steal)
    (stat((1008, 100, 5012, 0), (2000, 200, 4020, 0)), 0.0, 0.4, 2),  # a competitor 40% of the time: not a core
])
def test_free_cores_from_proc_stat_samples(after, own_s, busy, threads_):
    before, later = threads.cpu_ticks(BEFORE, CORES), threads.cpu_ticks(after, CORES)
    measured = threads.busy_cores(before, later, own_s, len(CORES))
    assert measured == pytest.approx(busy)
    assert threads.free_threads(len(CORES), measured) == threads_


def test_only_the_cores_this_process_may_use_count():
    before = stat((0, 0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0))
    after = stat((0, 0, 20, 0), (20, 0, 0, 0), (20, 0, 0, 0))  # cpu1 and cpu2 busy, this process may use 0 and 2
    measured = threads.busy_cores(threads.cpu_ticks(before, {0, 2}), threads.cpu_ticks(after, {0, 2}), 0.0, 2)
    assert measured == pytest.approx(1.0)
    assert threads.free_threads(4, None) == 4  # /proc/stat unreadable: every core


def test_explicit_settings_win_and_the_automatic_choice_is_measured_once(monkeypatch):
    calls = []
    monkeypatch.setattr(threads, "measure_busy", lambda cores: calls.append(cores) or 1.0)
    monkeypatch.setattr(threads, "_allowed", lambda: {0, 1})
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    threads._last.clear()
    try:
        auto = threads.choose(None)
        assert (auto.threads, auto.cores, auto.busy, auto.source) == (1, 2, 1, "free cores")
        assert auto.line().startswith("torch threads: 1 (2 cores, 1 busy; ")
        assert threads.choose(None) == auto and len(calls) == 1
        threads._last["at"] -= threads.REFRESH_S + 1
        assert threads.choose(None) == auto and len(calls) == 2  # an old measure is taken again
        assert threads.choose(2).threads == 2 and threads.choose(2).line().startswith("torch threads: 2 (threads key")
        monkeypatch.setenv("OMP_NUM_THREADS", "3")
        assert threads.choose(None).threads == 3 and threads.choose(1).threads == 1
        assert {auto, threads.choose(2)} <= set(threads.choices())
    finally:
        threads._last.clear()


def test_measuring_takes_this_process_out(monkeypatch):
    """A real window: this process spinning on one core is not "another process" keeping it busy."""
    samples = iter([BEFORE, stat((1020, 100, 5000, 0), (2000, 200, 4020, 0))])
    own = iter([10.0, 10.2])
    monkeypatch.setattr(threads, "read_stat", lambda: next(samples))
    monkeypatch.setattr(threads, "_own_seconds", lambda: next(own))
    assert threads.measure_busy(CORES, window=0.0) == pytest.approx(0.0)


def _policy_in_subprocess(code: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    return subprocess.run([sys.executable, "-c", code], env=clean | env, capture_output=True, text=True, check=True,
                          cwd=os.getcwd())


def test_passive_policy_reaches_libgomp_when_asked_and_the_user_set_none():
    """libgomp reads the policy once, when torch loads it; OMP_DISPLAY_ENV makes it print what it read."""
    pytest.importorskip("torch")
    code = "import toolaudit.engines, os; print(os.environ.get('OMP_WAIT_POLICY'))"
    assert _policy_in_subprocess(code).stdout.strip() == "None"  # not asked: libgomp's default (spin, then sleep)
    ours = _policy_in_subprocess(code + "; import torch", OMP_DISPLAY_ENV="true", TOOLAUDIT_PASSIVE_WAIT="1")
    assert ours.stdout.strip() == "passive" and "OMP_WAIT_POLICY = 'PASSIVE'" in ours.stderr
    assert _policy_in_subprocess(code, OMP_WAIT_POLICY="active", TOOLAUDIT_PASSIVE_WAIT="1").stdout.strip() == "active"
    assert _policy_in_subprocess(code, GOMP_SPINCOUNT="1000", TOOLAUDIT_PASSIVE_WAIT="1").stdout.strip() == "None"
    late = _policy_in_subprocess("import torch, toolaudit.engines as e, os; print(os.environ.get('OMP_WAIT_POLICY'), "
                                 "e.threads.wait_policy())", TOOLAUDIT_PASSIVE_WAIT="1")
    assert late.stdout.strip() == "None OMP_WAIT_POLICY unset (torch loaded before toolaudit)"


def test_vllm_processes_are_spawned_without_our_policy(monkeypatch):
    """vLLM binds its OpenMP threads to cores and waits its own way: the variable is unset while it spawns."""
    from toolaudit.engines.vllm import runtime

    monkeypatch.setenv("OMP_WAIT_POLICY", "passive")
    monkeypatch.setenv("KEEP", "1")
    with runtime.environment({"OMP_WAIT_POLICY": None, "KEEP": "2"}):
        assert "OMP_WAIT_POLICY" not in os.environ and os.environ["KEEP"] == "2"
    assert os.environ["OMP_WAIT_POLICY"] == "passive" and os.environ["KEEP"] == "1"
    from toolaudit.engines.paths import PathConfig
    from toolaudit.engines.vllm.engine import VLLMEngine

    path = PathConfig(name="v", engine="vllm", options={})  # defaults: the engine reads them typed
    monkeypatch.setattr(threads, "_set_by_us", {"OMP_WAIT_POLICY": "passive"})
    assert VLLMEngine(path)._env()["OMP_WAIT_POLICY"] is None
    monkeypatch.setattr(threads, "_set_by_us", {})  # the user's own policy reaches vLLM
    assert "OMP_WAIT_POLICY" not in VLLMEngine(path)._env()


def test_a_run_says_its_thread_choices_in_one_line(monkeypatch):
    """A replay measures the free cores again between chunks: choices that changed are one line, not one each."""
    made = {}
    monkeypatch.setattr(threads, "_made", made)
    assert threads.summary_line() is None
    made[threads.ThreadChoice(2, "free cores", 2, 0)] = None
    assert threads.summary_line().startswith("torch threads: 2 (2 cores, 0 busy; ")
    made[threads.ThreadChoice(1, "free cores", 2, 1)] = None
    assert threads.summary_line().startswith("torch threads: 1-2 over the run (2 cores, 0-1 busy when measured; ")
