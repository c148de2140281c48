"""A replay's probes: each of its paths probed (`probe.probe`, the bundled set) when the run starts and stored
with the run (`probes` rows with its run id and side), so every stored run can be told apart by runtime. A probe
that fails does not stop the replay: it is reported, and the run has no probe for that path."""

from __future__ import annotations

from collections.abc import Callable

from toolaudit import ToolauditError
from toolaudit.replay.probe import ProbeError, probe
from toolaudit.replay.probe_set import load_probe_set
from toolaudit.replay.runs import same_decoding
from toolaudit.store import Store
from toolaudit.store.probes import insert_probe

Report = Callable[[str], None]


def record_run_probes(store: Store, run_id: int, replayer, report: Report) -> None:
    """Probe the replay's baseline and candidates (a noise floor decodes on the baseline's runtime: not probed
    again) and store each probe with the run that holds its path's rows."""
    baseline = replayer.baseline_path
    targets = [(run_id, "baseline", baseline)]
    members = {m.path.name: m.run_id for m in replayer.members(run_id)}
    targets += [(members.get(p.name, run_id), "candidate", p) for p in replayer.candidate_paths
                if not same_decoding(baseline, p)]
    probe_set = load_probe_set(None)
    for rid, side, path in targets:
        try:
            result = probe(path, probe_set, repeats=2, factory=replayer.engines.factory)
        except (ProbeError, ToolauditError, RuntimeError, OSError) as exc:
            report(f"warning: probe of path {path.name} failed, the run records none for it: {exc}")
            continue
        result.probe_id = insert_probe(store, result.row(rid, side))
        stable = "stable" if result.stable else f"NOT stable (jitter max {result.jitter_max:.3g})"
        report(f"probe {result.probe_id} of {side} {path.name}: decisions {result.decisions}, numerics "
               f"{result.numerics or '-'}, {stable}, {result.seconds:.1f} s")
