"""Which stored probe a new one is compared with, and whether a probe has the numerics a user expects.

`fingerprint --probe --against REF` finds its reference here; `fingerprint --probe --expect FP` judges the probe
it just took; `check --expect-numerics FP` judges the newest stored probe of a path (the gate decodes nothing:
the probe is taken by `fingerprint --probe --db` or recorded by a replay)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from toolaudit import OptionError, RunNotFound
from toolaudit.replay.probe import Probe

MIN_PREFIX = 8  # characters of a numerics hash an expectation must give


@dataclass(frozen=True)
class Expectation:
    """A probe judged against the numerics hash the user expected: `ok`, the lines said, and the JSON."""

    ok: bool
    lines: list[str]
    data: dict[str, Any] = field(default_factory=dict)


def check_prefix(expected: str, option: str) -> None:
    if len(expected) < MIN_PREFIX:
        raise OptionError(f"{option} takes a numerics hash (num-...) or a prefix of {MIN_PREFIX}+ characters")


def judge(result: Probe, expected: str, stored: Probe | None, taken: str) -> Expectation:
    """Did `result` (a probe `taken` now, or stored) have the `expected` numerics? When it did not and the
    expected probe is in the database on the same set, say whether decisions changed or only numerics."""
    from toolaudit.analysis.probe_diff import compare_probes

    got = result.numerics or result.decisions
    ok = got.startswith(expected)
    lines = [f"probe of path {result.path_name} ({taken}): numerics {got} "
             f"({'as expected' if ok else f'expected {expected}'})"]
    data = {"path": result.path_name, "probe_id": result.probe_id, "expected": expected,
            "numerics": result.numerics, "decisions": result.decisions, "ok": ok,
            "seconds": round(result.seconds, 3)}
    if not ok and stored is not None and stored.probe_set == result.probe_set:
        change = compare_probes(stored, result)
        what = "decisions changed" if not change.same_decisions else "numerics changed, decisions identical"
        lines.append(f"  {what}: {change.words()}")
        data["change"] = change.as_dict()
    elif not ok:
        lines.append(f"  decisions now {result.decisions}; the expected probe is not in this database on the same "
                     "probe set, so whether the decisions changed too is not known (store probes with "
                     "`fingerprint --probe --db`)")
    return Expectation(ok, lines, data)


def expected_probe(store, expected: str) -> Probe | None:
    """The stored probe whose numerics hash starts with `expected`, if any."""
    from toolaudit.store.probes import probe_by_numerics

    row = probe_by_numerics(store, expected) if store is not None else None
    return Probe.from_row(row) if row is not None else None


def stored_expectation(store, path_name: str, expected: str) -> Expectation:
    """`check --expect-numerics`: the newest stored probe of `path_name` judged against `expected`."""
    from toolaudit.store.probes import latest_probe

    check_prefix(expected, "--expect-numerics")
    row = latest_probe(store, path_name)
    if row is None:
        raise RunNotFound(f"{store.path}: no stored probe of path {path_name} to judge: take one first with "
                          f"`toolaudit fingerprint --probe --path {path_name} --db {store.path} --expect {expected}`")
    return judge(Probe.from_row(row), expected, expected_probe(store, expected), f"probe {row['probe_id']}, stored")


def reference_set(reference: Probe, current):
    """The probe set to decode against `reference`: `current` when the reference decoded it, else the
    reference's own set when it can be rebuilt as it was (a run's smaller probe: `probe_set.RUN_SOURCE`; a probe
    file still there, unchanged), else `current` (the comparison then says the sets differ)."""
    from toolaudit import TraceError
    from toolaudit.replay.probe_set import probe_set_for

    if reference.probe_set == current.digest:
        return current
    try:
        theirs = probe_set_for(reference.source)
    except TraceError:
        return current
    return theirs if theirs.digest == reference.probe_set else current


def find_reference(store, ref: str, path_name: str, probe_set: str | None = None,
                   note: Callable[[str], None] | None = None) -> Probe | None:
    """The stored probe `--against` names: `latest` (the newest probe of the path on `probe_set`, a digest, when
    given; None when there is none yet), `probe:N` or `run:ID|NAME`; bare digits are a probe id when such a probe
    exists, else a run; other text is a run name. A run's probe is the one of the path probed: a run that probed
    other paths only is refused, one whose probe of the path was unavailable says why. `note` hears which run a
    name several runs share was taken to mean."""
    from toolaudit.store import queries as q
    from toolaudit.store.probes import latest_probe, probe_by_id

    if ref == "latest":
        row = latest_probe(store, path_name, probe_set)
        return Probe.from_row(row) if row is not None else None
    kind, _, text = ref.partition(":") if ref.startswith(("probe:", "run:")) else ("", "", ref)
    if kind == "probe" or (not kind and text.isdigit()):
        row = probe_by_id(store, int(text)) if text.isdigit() else None
        if row is not None:
            return Probe.from_row(row)
        if kind == "probe":
            raise RunNotFound(f"{store.path}: no probe with id {text}")
    found = q.find_run(store, text)
    if found.others and note is not None:
        note(f"--against {text}: {len(found.others) + 1} runs are named {found.run['name']!r} (runs "
             f"{', '.join(map(str, sorted([found.run['run_id'], *found.others])))}); using the newest, run "
             f"{found.run['run_id']}")
    return _run_probe(store, ref, found.run["run_id"], path_name)


def _run_probe(store, ref: str, run_id: int, path_name: str) -> Probe:
    from toolaudit.store.probes import probes_of_run, unavailable_probes

    rows = probes_of_run(store, run_id)
    chosen = next((r for r in rows if r["path_name"] == path_name), None)
    missing = unavailable_probes(store, run_id)
    gone = next((u for u in missing if u["path_name"] == path_name), None)
    if chosen is None and (gone is not None or (not rows and missing)):
        gone = gone or missing[0]
        raise RunNotFound(f"{store.path}: run {run_id} recorded no probe of path {gone['path_name']}: probe "
                          f"unavailable: {gone['reason']}")
    if not rows:
        raise RunNotFound(f"{store.path}: run {run_id} recorded no probe (replayed with --no-probe, or before "
                          "probes were recorded)")
    if chosen is None:
        probed = ", ".join(f"{r['path_name']} ({r['side']}: probe {r['probe_id']})" for r in rows)
        first = rows[-1]
        raise OptionError(f"--against {ref}: run {run_id} recorded no probe of path {path_name}, only of "
                          f"{probed}; a probe of another path differs by the paths, not by a change. Probe that "
                          f"path (--path {first['path_name']}), or name its probe to compare across paths anyway "
                          f"(--against probe:{first['probe_id']})")
    return Probe.from_row(chosen)
