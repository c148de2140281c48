"""A replay's probes: each of its paths probed when the run starts and stored with the run (`probes` rows with its
run id and side), so every stored run can be told apart by runtime.

A run's probe is small, to stay off the run's critical path: the run's probe set (`probe_set.run_probe_set`: six
near-tie prompts of the bundled set, eight tokens each) decoded once (RUN_REPEATS), seconds per in-process path.
An endpoint (an engine not in process) is probed within ENDPOINT_DEADLINE_S seconds in all, one attempt per
request and none after the first failure, outside the replay's retry loop (`probe.WITHIN_KEY`, the openai
engine's `within_s`): a faulty or slow endpoint costs the run at most those seconds. The probe goes before the
replay's first call, on a quiet server: beside the replay's requests the server would batch them together, which
changes the probe's numerics (and perhaps the replay's answers).

A probe that cannot be taken (a fault, the deadline, a path that fails to load) never stops the replay: it is
reported, and recorded with the run as unavailable, with the reason (`store.probes.record_unavailable`)."""

from __future__ import annotations

from collections.abc import Callable

from toolaudit.engines.registry import ENGINES
from toolaudit.replay.probe import probe
from toolaudit.replay.probe_set import run_probe_set
from toolaudit.replay.runs import same_decoding
from toolaudit.store import Store
from toolaudit.store.probes import insert_probe, record_unavailable

Report = Callable[[str], None]
RUN_REPEATS = 1  # a run's probe decodes its set once (stability is `fingerprint --probe --repeats`'s to measure)
ENDPOINT_DEADLINE_S = 6.0  # an endpoint's whole probe (its six requests), after which it is unavailable


def record_run_probes(store: Store, run_id: int, replayer, report: Report) -> None:
    """Probe the replay's baseline and candidates (a noise floor decodes on the baseline's runtime: not probed
    again) and store each probe with the run that holds its path's rows; a probe that fails is recorded there as
    unavailable."""
    baseline = replayer.baseline_path
    targets = [(run_id, "baseline", baseline)]
    members = {m.path.name: m.run_id for m in replayer.members(run_id)}
    targets += [(members.get(p.name, run_id), "candidate", p) for p in replayer.candidate_paths
                if not same_decoding(baseline, p)]
    probe_set = run_probe_set()
    unavailable: dict[int, list[dict]] = {}
    for rid, side, path in targets:
        try:
            endpoint = not ENGINES.spec(path.engine, f"paths.{path.name}").capabilities.in_process
            result = probe(path, probe_set, repeats=RUN_REPEATS, factory=replayer.engines.factory,
                           deadline_s=ENDPOINT_DEADLINE_S if endpoint else None)
        except Exception as exc:  # noqa: BLE001 -- whatever stops a probe, the replay goes on without it
            reason = str(exc) or type(exc).__name__
            unavailable.setdefault(rid, []).append({"side": side, "path_name": path.name, "reason": reason})
            report(f"warning: probe of {side} {path.name} unavailable, the run records why: {reason}")
            continue
        result.probe_id = insert_probe(store, result.row(rid, side))
        stable = ("" if RUN_REPEATS == 1 else ", stable" if result.stable else
                  f", NOT stable (jitter max {result.jitter_max:.3g})")
        report(f"probe {result.probe_id} of {side} {path.name}: decisions {result.decisions}, numerics "
               f"{result.numerics or '-'}{stable}, {len(probe_set)} prompts x {RUN_REPEATS} in "
               f"{result.seconds:.1f} s")
    for rid, entries in unavailable.items():
        record_unavailable(store, rid, entries)
