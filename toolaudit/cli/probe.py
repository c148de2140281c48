"""`toolaudit fingerprint --probe`: probe a path, store it, compare it with an earlier probe in words, judge it
against the numerics expected (analysis/probe_refs.py finds and judges; this module prints)."""

from __future__ import annotations

import sys

import click

from toolaudit.report.output import to_json


def probe_command(path, probe_file: str | None, repeats: int, db: str | None, against: str | None,
                  expect: str | None, as_json: bool) -> None:
    """Probe `path`, store it with --db, compare it with --against, judge it with --expect; print the
    fingerprints and the time. Against a probe of another set (a run's smaller probe), and without --probe-file,
    the path is probed with that set. Exit 1: not comparable with --against, or not the --expect numerics."""
    from toolaudit.analysis.probe_diff import compare_probes
    from toolaudit.analysis.probe_refs import check_prefix, judge
    from toolaudit.replay.probe import probe

    if against is not None and db is None:
        raise click.UsageError("--against needs --db (the database that holds the earlier probe or run)")
    if expect is not None:
        check_prefix(expect, "--expect")
    probe_set, reference = _reference(path, probe_file, db, against, as_json)
    if not as_json:
        click.echo(f"probing path {path.name} ({path.engine}): {len(probe_set)} prompts x {repeats} repeats "
                   f"({probe_set.describe()})...", err=True)
    result = probe(path, probe_set, repeats)
    expected = _store(result, db, expect)
    change = compare_probes(reference, result) if reference is not None else None
    judged = judge(result, expect, expected, "probed now") if expect is not None else None
    if as_json:
        data = result.as_dict()
        if against is not None:
            data["against"] = ({"probe_id": reference.probe_id, "repeats": reference.repeats, **change.as_dict()}
                               if change else None)
        click.echo(to_json(data | ({"expect": judged.data} if judged else {})))
    else:
        _print_probe(result, db, reference, change)
        for line in judged.lines if judged else []:
            click.echo(line)
    if change is not None and not change.comparable:  # a comparison of nothing is no "unchanged": exit 1
        raise click.ClickException(f"against probe {reference.probe_id} ({reference.path_name}): {change.words()}")
    if judged is not None and not judged.ok:
        sys.exit(1)


def _reference(path, probe_file: str | None, db: str | None, against: str | None, as_json: bool):
    """(the probe set to decode, the stored probe --against names or None)."""
    from toolaudit.analysis.probe_refs import find_reference, reference_set
    from toolaudit.replay.probe_set import load_probe_set
    from toolaudit.store import Store

    probe_set = load_probe_set(probe_file)
    if against is None:
        return probe_set, None
    with Store(db) as store:
        reference = find_reference(store, against, path.name, probe_set.digest,
                                   note=lambda m: click.echo(f"note: {m}", err=True))
    if reference is None and not as_json:
        click.echo(f"--against latest: no earlier probe of path {path.name} on this probe set in {db}: nothing "
                   "to compare yet", err=True)
    elif reference is not None and probe_file is None:
        probe_set = reference_set(reference, probe_set)
    return probe_set, reference


def _store(result, db: str | None, expect: str | None):
    """Store the probe with --db; the stored probe with the --expect numerics, if the database holds one."""
    from toolaudit.analysis.probe_refs import expected_probe
    from toolaudit.store import Store
    from toolaudit.store.probes import insert_probe

    if db is None:
        return None
    with Store(db) as store:
        expected = expected_probe(store, expect) if expect is not None else None
        result.probe_id = insert_probe(store, result.row())
    return expected


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


