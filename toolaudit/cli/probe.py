"""`toolaudit fingerprint --probe` and `check --expect-numerics`: probe a path, store it, compare it, in words."""

from __future__ import annotations

import click

from toolaudit.cli.common import resolve_run
from toolaudit.report.output import to_json


def probe_command(path, probe_file: str | None, repeats: int, db: str | None, against: str | None,
                  as_json: bool) -> None:
    """Probe `path`, store it with --db, compare it with --against; print the fingerprints and the time. Against
    a probe of another set (a run's smaller probe), and without --probe-file, the path is probed with that set."""
    from toolaudit.analysis.probe_diff import compare_probes
    from toolaudit.replay.probe import probe
    from toolaudit.replay.probe_set import load_probe_set
    from toolaudit.store import Store
    from toolaudit.store.probes import insert_probe

    if against is not None and db is None:
        raise click.UsageError("--against needs --db (the database that holds the earlier probe or run)")
    probe_set = load_probe_set(probe_file)
    reference = change = None
    if against is not None:
        with Store(db) as store:
            reference = find_reference(store, against, path.name, probe_set.digest)
        if reference is None and not as_json:
            click.echo(f"--against latest: no earlier probe of path {path.name} on this probe set in {db}: nothing "
                       "to compare yet", err=True)
        elif reference is not None and probe_file is None:
            probe_set = reference_set(reference, probe_set)
    if not as_json:
        click.echo(f"probing path {path.name} ({path.engine}): {len(probe_set)} prompts x {repeats} repeats "
                   f"({probe_set.describe()})...", err=True)
    result = probe(path, probe_set, repeats)
    if db is not None:
        with Store(db) as store:
            result.probe_id = insert_probe(store, result.row())
    if reference is not None:
        change = compare_probes(reference, result)
    if as_json:
        data = result.as_dict()
        if against is not None:
            data["against"] = ({"probe_id": reference.probe_id, "repeats": reference.repeats, **change.as_dict()}
                               if change else None)
        click.echo(to_json(data))
    else:
        _print_probe(result, db, reference, change)
    if change is not None and not change.comparable:  # a comparison of nothing is no "unchanged": exit 1
        raise click.ClickException(f"against probe {reference.probe_id} ({reference.path_name}): {change.words()}")


def _print_probe(result, db: str | None, reference, change) -> None:
    """The probe as the terminal shows it, where it was stored, and the comparison in words."""
    for line in probe_lines(result):
        click.echo(line)
    if db is not None:
        click.echo(f"stored as probe {result.probe_id} in {db}")
    if change is None or not change.comparable:
        return
    click.echo(f"against probe {reference.probe_id} ({reference.path_name}, {reference.config_fingerprint}): "
               f"{change.words()}")
    if reference.path_name != result.path_name:
        click.echo(f"note: probe {reference.probe_id} is of path {reference.path_name}, this one of "
                   f"{result.path_name}: what differs may be the paths, not a change")
    if reference.repeats != result.repeats:
        click.echo(f"note: probe {reference.probe_id} decoded its set {reference.repeats} time(s), this probe "
                   f"{result.repeats}: the hashes compare the first decode of each"
                   + ("; the reference's stability was not measured" if reference.repeats == 1 else ""))


def reference_set(reference, current):
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


def probe_lines(p) -> list[str]:
    """A probe as the terminal shows it: the fingerprints, whether the repeats agreed, the time it took."""
    lines = [f"path {p.path_name}: config {p.config_fingerprint}",
             f"decisions {p.decisions}  numerics {p.numerics or '- (no logprobs)'}"]
    if p.stable:
        lines.append(f"stable: {p.repeats} repeats bit-identical" if p.repeats > 1 else
                     "stable: not measured (1 repeat)")
    else:
        lines.append(f"NOT stable: the repeats differ on {len(p.unstable_prompts)} of {p.prompts} prompts, jitter "
                     f"max {p.jitter_max:.3g}, median {p.jitter_median:.3g} |delta logprob|; the hashes are the "
                     "first repeat's and will not reproduce bit for bit")
    if p.note:
        lines.append(f"note: {p.note}")
    lines.append(f"probe: {p.prompts} prompts x {p.repeats} in {p.seconds:.1f} s (load {p.load_seconds:.1f} s)")
    return lines


def find_reference(store, ref: str, path_name: str, probe_set: str | None = None):
    """The stored probe `--against` names: `latest` (the newest probe of the path on `probe_set`, a digest, when
    given; None when there is none yet), `probe:N` or `run:ID|NAME`; bare digits are a probe id when such a probe
    exists, else a run; other text is a run name. A run's probe is the one of the path probed: a run that probed
    other paths only is refused (`_other_paths`), one whose probe of the path was unavailable says why."""
    from toolaudit import RunNotFound
    from toolaudit.replay.probe import Probe
    from toolaudit.store.probes import latest_probe, probe_by_id, probes_of_run, unavailable_probes

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
    run_id = resolve_run(store, text, "--against")
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
        raise _other_paths(ref, run_id, path_name, rows)
    return Probe.from_row(chosen)


def _other_paths(ref: str, run_id: int, path_name: str, rows: list[dict]) -> click.UsageError:
    """A run that probed other paths only: comparing with one of them would report how two paths differ as a
    change of this one. Refused, naming both; the user may still ask for it by the probe's id."""
    probed = ", ".join(f"{r['path_name']} ({r['side']}: probe {r['probe_id']})" for r in rows)
    first = rows[-1]
    return click.UsageError(f"--against {ref}: run {run_id} recorded no probe of path {path_name}, only of "
                            f"{probed}; a probe of another path differs by the paths, not by a change. Probe that "
                            f"path (--path {first['path_name']}), or name its probe to compare across paths anyway "
                            f"(--against probe:{first['probe_id']})")


def expect_numerics(store, run_id: int, expected: str, path_name: str | None, paths_file: str | None,
                    repeats: int = 2) -> tuple[bool, list[str], dict]:
    """`check --expect-numerics FP`: probe the run's candidate path (or `path_name`) now, with the probe set of
    the stored probe that has FP when it can be rebuilt (a run's smaller set, a probe file still there; else the
    bundled set); (ok, lines, JSON)."""
    from toolaudit import OptionError
    from toolaudit.analysis.probe_diff import compare_probes
    from toolaudit.engines.paths import load_paths
    from toolaudit.replay.probe import Probe, probe
    from toolaudit.replay.probe_set import load_probe_set
    from toolaudit.store.probes import probe_by_numerics

    if len(expected) < 8:
        raise click.UsageError("--expect-numerics takes a numerics hash (num-...) or a prefix of 8+ characters")
    run = store.run_row(run_id)
    name = path_name or run["candidate_name"]
    paths = load_paths(paths_file or _run_paths_file(run))
    if name not in paths:
        raise OptionError(f"--expect-numerics: unknown decode path {name!r} (give --path and --paths)")
    row = probe_by_numerics(store, expected)
    stored = Probe.from_row(row) if row is not None else None
    # the expected probe's own set (a run's smaller set, or a probe file still there) where it can be rebuilt as it
    # was, else the bundled set
    probe_set = reference_set(stored, load_probe_set()) if stored is not None else load_probe_set()
    if stored is not None and stored.probe_set != probe_set.digest:
        stored = None  # another probe set: no prompt-by-prompt comparison
    result = probe(paths[name], probe_set, repeats)
    got = result.numerics or result.decisions
    ok = got.startswith(expected)
    head = (f"probe of path {name}: numerics {got} in {result.seconds:.1f} s "
            f"({'as expected' if ok else f'expected {expected}'})")
    lines = [head]
    data = {"path": name, "expected": expected, "numerics": result.numerics, "decisions": result.decisions,
            "ok": ok, "seconds": round(result.seconds, 3)}
    if not ok and stored is not None:
        change = compare_probes(stored, result)
        what = "decisions changed" if not change.same_decisions else "numerics changed, decisions identical"
        lines.append(f"  {what}: {change.words()}")
        data["change"] = change.as_dict()
    elif not ok:
        lines.append(f"  decisions now {result.decisions}; the expected probe is not in this database, so whether "
                     "the decisions changed too is not known (store probes with `fingerprint --probe --db`)")
    return ok, lines, data


def _run_paths_file(run: dict) -> str | None:
    import orjson

    options = orjson.loads(run["options"]) if run.get("options") else {}
    return options.get("paths_file")
