"""`toolaudit report` (per-customer drift reports) and `toolaudit check` (the CI gate; logic in budgets.py)."""

from __future__ import annotations

import sys
from dataclasses import replace

import click

from toolaudit.cli.common import (
    Proportion,
    budget_options,
    db_option,
    deprecated_format,
    deprecated_format_option,
    example,
    friendly_errors,
    gate_rule,
    option_group,
    output_options,
    print_rows,
    reading,
    resolve_run,
    rule_option,
    run_option,
)
from toolaudit.cli.history import path_pair_option, write_history_pages
from toolaudit.report.output import to_json


class CannotCheck(click.ClickException):
    """The gate could not be evaluated (no database, no such run, nothing measured, an unreadable file): exit 2, as
    for a usage error; 1 means a bound is broken."""

    exit_code = 2


REPORT_OPTIONS = option_group(
    db_option,
    run_option(),
    click.option("--customer", "customers", multiple=True, help="Customer to report on (repeatable)."),
    click.option("--all-customers", is_flag=True, help="One report per customer of the run."),
    click.option("--write", "formats", multiple=True, metavar="html,md,json",
                 help="Report files to write, repeatable or comma-separated (default: all three)."),
    click.option("--as", "as_", multiple=True, metavar="table|json", help="What to print: the files written and, for "
                 "a matrix, its remedies (table, the default), or JSON (--json). Before this release --as named the "
                 "files to write: --as html/md/json still does, with a warning (use --write)."),
    deprecated_format_option,
    click.option("-o", "--output", "out_dir", default="reports", show_default=True,
                 type=click.Path(file_okay=False), help="Folder; files go to <folder>/run-<id>/<customer>.<ext>"),
    click.option("--near-tie-margin", default=1.0, show_default=True, type=click.FloatRange(0, min_open=True),
                 help="Baseline logit margin below which a divergence counts as a near-tie (numerics)."),
    click.option("--max-call-drift", type=Proportion(), help="Call drift budget for routing advice (0.015 or 1.5%)."),
    click.option("--max-session-drift", type=Proportion(), help="Session drift budget for routing advice."),
    click.option("--session-calls", type=click.FloatRange(1), help="Calls per session for the session budget "
                 "(default: the customer's mean)."),
    click.option("--max-shifted-calls", type=Proportion(), help="A sampled matrix: the budget on the share of calls "
                 "whose outcome distribution shifted, for the remedy reports' recommendation (5%)."),
    click.option("--json", "as_json", is_flag=True,
                 help="Print the files written and each customer's headline figures as one JSON object (--as json)."),
    click.option("--history", is_flag=True, hidden=True, help="Deprecated: `toolaudit history --html`."),
    path_pair_option,
)


@click.command(epilog=example("toolaudit report --run nightly --all-customers --write html,md -o reports/ "
                             "--db audit.duckdb"))
@REPORT_OPTIONS
@friendly_errors
def report(db: str, run_ref: str | None, customers: tuple[str, ...], all_customers: bool, formats: tuple[str, ...],
           as_: tuple[str, ...], old_format: tuple[str, ...], out_dir: str, near_tie_margin: float,
           max_call_drift: float | None, max_session_drift: float | None, session_calls: float | None,
           max_shifted_calls: float | None, as_json: bool, history: bool, path_pair: tuple[str, str] | None) -> None:
    """Write per-customer drift reports (HTML, Markdown, JSON) for a run.

    For a matrix run (`replay --candidate A --candidate B ...`): each candidate's reports, and per customer a
    remedy report (every candidate's drift and speed, the Pareto frontier, the fastest candidate within the
    --max-call-drift / --max-session-drift budget), also printed here. A sampled run's reports add its
    distribution tests; a sampled matrix's remedy reports judge --max-shifted-calls. The runs over time:
    `toolaudit history --html`."""
    from toolaudit.report import ReportOptions

    old = deprecated_format("report", old_format, "--write html|md|json")
    fmt, files = _report_outputs(as_, as_json, formats + old)
    if history:
        click.echo("warning: `report --history` is deprecated: use `toolaudit history --html` (same pages)", err=True)
        if max_session_drift is not None or session_calls is not None or max_shifted_calls is not None:
            raise click.UsageError("--history draws the call drift budget (--max-call-drift) only")
        _report_history(db, run_ref, customers, all_customers, files, out_dir, max_call_drift, path_pair,
                        fmt == "json")
        return
    if path_pair:
        raise click.UsageError("--path-pair goes with `toolaudit history --html`")
    if bool(customers) == all_customers:
        raise click.UsageError("pass --customer C (repeatable) or --all-customers")
    if session_calls is not None and max_session_drift is None:
        raise click.UsageError("--session-calls needs --max-session-drift")
    options = ReportOptions(near_tie_margin=near_tie_margin, max_call_drift=max_call_drift,
                            max_session_drift=max_session_drift, session_calls=session_calls,
                            max_shifted_calls=max_shifted_calls)
    _write_reports(db, run_ref, None if all_customers else customers, files, out_dir, options, fmt)


def _report_outputs(as_: tuple[str, ...], as_json: bool, files: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """(what to print, which files): `--as table|json` prints; the older `--as html,md,json` names files (warned)."""
    values = [v.strip().lower() for value in as_ for v in value.split(",") if v.strip()]
    unknown = [v for v in values if v not in ("table", "json", "html", "md", "markdown")]
    if unknown:
        raise click.UsageError(f"--as: unknown format {unknown[0]!r}; print as table or json (files: --write "
                               "html,md,json)")
    if values and set(values) <= {"table"} or values == ["json"] and files:
        return ("json" if "json" in values or as_json else "table"), files
    if values:
        click.echo(f"warning: `report --as {','.join(values)}` names files to write: that spelling is deprecated, "
                   f"use --write {','.join(values)} (--as will name what is printed: table or json)", err=True)
    return ("json" if as_json else "table"), files + tuple(values)


def _write_reports(db: str, run_ref: str | None, customers: tuple[str, ...] | None, files: tuple[str, ...],
                   out_dir: str, options, fmt: str) -> None:
    from toolaudit.analysis.frontier import Budget
    from toolaudit.report import parse_formats, write_reports_detailed
    from toolaudit.report.write import ReportError, written_json

    try:
        wanted = parse_formats(files)
    except ReportError as exc:
        raise click.UsageError(f"--write: {exc}") from None
    budget = Budget(options.max_call_drift, options.max_session_drift, max_shifted_calls=options.max_shifted_calls)
    with reading(db) as store:
        run = store.run_row(resolve_run(store, run_ref))
        if options.max_shifted_calls is not None and not _sampled_matrix(store, run):
            raise click.UsageError(f"--max-shifted-calls: run {run['run_id']} is not a sampled matrix (it judges the "
                                   "remedy reports of `replay --samples N` with several candidates; `check "
                                   "--max-shifted-calls` gates one sampled run)")
        written = write_reports_detailed(store, run["run_id"], customers, wanted, out_dir, options)
        if fmt == "json":
            from toolaudit.analysis.frontier import frontiers_dict

            matrix = (frontiers_dict(store, run["run_id"], budget, options.session_calls)
                      if run["kind"] == "matrix" else None)
            click.echo(to_json(written_json(run, written, matrix)))
            return
        if run["kind"] == "matrix":  # the remedies per customer on the terminal too
            from toolaudit.cli.show import show_matrix

            show_matrix(store, run["run_id"], "table", budget, options.session_calls)
    for w in written:
        click.echo(str(w.path))


def _sampled_matrix(store, run: dict) -> bool:
    from toolaudit.analysis.runs import is_sampled

    return run["kind"] == "matrix" and any(is_sampled(m) for m in store.matrix_members(run["run_id"]))


def _report_history(db: str, run_ref: str | None, customers: tuple[str, ...], all_customers: bool,
                    formats: tuple[str, ...], out_dir: str, budget: float | None, path_pair: tuple[str, str] | None,
                    as_json: bool) -> None:
    if run_ref is not None:
        raise click.UsageError("--history covers every run; --run does not go with it (use --path-pair)")
    write_history_pages(db, customers, all_customers, formats, out_dir, budget, path_pair, as_json)


CHECK_OPTIONS = option_group(
    db_option,
    run_option(),
    budget_options("check"),
    click.option("--session-calls", type=click.FloatRange(1), help="Calls per session for --max-session-drift "
                 "(default: the traces' mean, else the run's, as `frontier`)."),
    click.option("--against", "against_ref", metavar="ID|NAME", help="Earlier run to compare call drift with: an id, "
                 "or a name (the newest run of that name before the run checked, so `--run nightly --against nightly` "
                 "compares with the previous nightly)."),
    click.option("--max-increase", type=Proportion(points=True),
                 help="Largest allowed rise in call drift vs --against (0.005, 0.5pp or 0.5%); fails only when the "
                      "rise is also significant."),
    click.option("--expect-fingerprint", metavar="FP",
                 help="Fail unless the candidate path has this fingerprint (or an 8+ character prefix)."),
    click.option("--max-valid-drop", type=Proportion(points=True),
                 help="Sampled runs: largest allowed drop of the schema-valid rate, baseline minus candidate paired by "
                      "call (0.02, 2% or 2pp), judged on the 95% interval by --rule."),
    click.option("--expect-numerics", metavar="FP", help="Fail unless the newest stored probe of the run's candidate "
                 "path (or --path) has numerics hash FP (an 8+ character prefix), naming decisions vs numerics. The "
                 "gate decodes nothing: `fingerprint --probe --db` (or a replay) stores the probe."),
    click.option("--path", "probe_path", metavar="NAME",
                 help="With --expect-numerics: the path whose probe is judged."),
    click.option("--paths", "probe_paths", hidden=True, help="Deprecated: check no longer probes (`fingerprint "
                 "--probe --expect` does)."),
    rule_option,
    click.option("--use-upper-bound", is_flag=True, help="Older spelling of --rule upper (now the default)."),
    click.option("--allow-errors", type=click.IntRange(0), default=0, show_default=True, metavar="N",
                 help="Error rows tolerated (input records the readers could not use, calls an engine failed)."),
    output_options,
)


@click.command(epilog=example("toolaudit check --run nightly --max-call-drift 1.5% --against nightly "
                             "--max-increase 0.5pp --db audit.duckdb"))
@CHECK_OPTIONS
def check(db: str, run_ref: str | None, session_calls: float | None, against_ref: str | None,
          max_increase: float | None, expect_fingerprint: str | None, max_valid_drop: float | None,
          expect_numerics: str | None, probe_path: str | None, probe_paths: str | None, rule: str | None,
          use_upper_bound: bool, allow_errors: int, fmt: str, **budgets: float | None) -> None:
    """Gate a run on drift bounds: exit 0 within all, 1 when one is broken, 2 on usage errors.

    Budgets are judged by one rule, printed with the verdict (default: the 95% Wilson upper bound must be within
    budget; `frontier` uses the same). A matrix run gates every candidate; each broken bound is printed with the
    candidate's name. Error rows fail the gate unless --allow-errors covers them. On a sampled run (replay
    --samples N), --max-shifted-calls and --max-valid-drop gate the distribution tests."""
    from toolaudit import ToolauditError
    from toolaudit.analysis.budgets import Bounds, GateUsageError, gate

    # `against` holds the text until the store is open (validate() asks only whether it was given)
    bounds = Bounds(rule=gate_rule(rule, use_upper_bound), against=against_ref, max_increase=max_increase,
                    expect_fingerprint=expect_fingerprint, allow_errors=allow_errors, session_calls=session_calls,
                    max_valid_drop=max_valid_drop, **budgets)
    only_probe = bool(expect_numerics) and not bounds.given  # the probe alone is a bound too
    try:
        if not only_probe:
            bounds.validate()  # before the database is opened: a usage error whatever the file holds
        with reading(db) as store:
            run_id = store.run_row(resolve_run(store, run_ref))["run_id"]
            if against_ref is not None:
                bounds = replace(bounds, against=resolve_run(store, against_ref, "--against", before=run_id))
            verdict = None if only_probe else gate(store, run_id, bounds)
            probed = _probe(store, run_id, expect_numerics, probe_path, probe_paths)
    except GateUsageError as exc:
        raise click.UsageError(str(exc)) from None
    except ToolauditError as exc:
        raise CannotCheck(str(exc)) from None
    _say_verdict(verdict, probed, db, fmt)


def _say_verdict(verdict, probed, db: str, fmt: str) -> None:
    """The gate's verdict and the probe's judgement, printed (a table, JSON, or CSV: one row per bound judged);
    exit 1 when a bound is broken."""
    for warning in verdict.warnings() if verdict else []:
        click.echo(warning, err=True)
    data = (verdict.as_dict() if verdict else {}) | ({"probe": probed[2]} if probed else {})
    if fmt == "json":
        click.echo(to_json(data))
    elif fmt == "csv":
        rows = [[r["candidate"], c["name"], c["ok"], c["figure"], c["threshold"], c["rule"], c["reason"]]
                for r in data.get("runs", []) for c in r["checks"]]
        if probed:
            rows.append([probed[2]["path"], "expect_numerics", probed[2]["ok"], probed[2]["numerics"],
                         probed[2]["expected"], None, None])
        print_rows(["candidate", "bound", "ok", "figure", "threshold", "rule", "reason"], rows, "csv")
    else:
        for line in (_verdict_lines(verdict, db) if verdict else []) + (probed[1] if probed else []):
            click.echo(line)
    if (verdict and not verdict.ok) or (probed and not probed[0]):
        sys.exit(1)


def _probe(store, run_id: int, expected: str | None, path: str | None, paths: str | None):
    """`--expect-numerics`: (ok, lines, JSON) of the newest stored probe of the run's candidate path (or
    `path`), or None when not asked."""
    if expected is None:
        if path or paths:
            raise click.UsageError("--path goes with --expect-numerics")
        return None
    from toolaudit.analysis.probe_refs import stored_expectation

    if paths:
        click.echo("warning: `check --paths` is deprecated: check judges the stored probe and decodes nothing; take "
                   "the probe with `toolaudit fingerprint --probe --path NAME --paths FILE --db DB --expect FP`",
                   err=True)
    judged = stored_expectation(store, path or store.run_row(run_id)["candidate_name"], expected)
    return judged.ok, judged.lines, judged.data


def _verdict_lines(verdict, db: str) -> list[str]:
    """A plain run prints its ok line or one line per broken bound; a matrix names each candidate. Then the rule
    that decided, and for broken error-row bounds the query that lists the rows."""
    lines = []
    for g in verdict.gates:
        if g.result.ok:
            lines.append(verdict.label(g, ok=True) + g.result.ok_line())
        for check in g.result.violations:
            lines.append(verdict.label(g) + check.message)
            lines += [f"  see them: toolaudit sql \"{sql}\" --db {db}" for sql in check.queries]
    return lines + verdict.rule_lines()
