"""`toolaudit history`: the runs of each path pair over time, and what changed when the drift moved."""

from __future__ import annotations

import csv
import sys
from typing import Any

import click

from toolaudit.cli.common import (
    Proportion,
    db_option,
    example,
    friendly_errors,
    gate_rule,
    option_group,
    output_options,
    reading,
    rule_option,
)
from toolaudit.report.numbers import pct
from toolaudit.report.output import csv_cell, format_table, to_json


def path_pair_option(func):
    return click.option("--path-pair", nargs=2, metavar="BASELINE CANDIDATE", default=None, callback=_path_pair,
                        help="Only the runs of this baseline and candidate path (default: every pair).")(func)


def _path_pair(ctx: click.Context, param: click.Parameter, value: tuple[str, str] | None
               ) -> tuple[str, str] | None:
    """Two path names. Given one, click takes the next option for the candidate (`--path-pair target --db X`:
    `--db` as a name, then X as an extra argument): say the spelling instead (`A:B` spelt as `A B`)."""
    if not value:
        return None
    baseline, candidate = value
    if candidate.startswith("-"):
        left, sep, right = baseline.partition(":")
        example = f"{left} {right}" if sep and left and right else f"{baseline} CANDIDATE"
        raise click.BadParameter(f"takes two decode path names, the baseline's and the candidate's: --path-pair "
                                 f"{example} (got {baseline!r}, then the option {candidate})", ctx, param)
    return value


HISTORY_OPTIONS = option_group(
    db_option,
    path_pair_option,
    click.option("--customer", help="Only this customer's calls in every figure (and the runs that have any)."),
    click.option("--budget", type=Proportion(), help="Call drift budget each run is judged against (0.015 or 1.5%)."),
    rule_option,
    click.option("--html", is_flag=True, help="Write the history as HTML pages instead of printing it: "
                 "<folder>/history.html over every customer's calls, or with --customer / --all-customers "
                 "<folder>/history/<customer>.html from that customer's calls only (the paths are printed)."),
    click.option("--all-customers", is_flag=True, help="With --html: one page per customer."),
    click.option("-o", "--output", "out_dir", default="reports", show_default=True, type=click.Path(file_okay=False),
                 help="With --html: the folder the pages go to."),
    output_options,
)


@click.command("history", epilog=example(
    "toolaudit history --path-pair target spec-ngram --budget 1.5% --db canary.duckdb",
    "toolaudit history --customer acme --csv --db canary.duckdb",
    "toolaudit history --html --all-customers -o reports/ --db canary.duckdb"))
@HISTORY_OPTIONS
@friendly_errors
def history_cmd(db: str, path_pair: tuple[str, str] | None, customer: str | None, budget: float | None,
                rule: str | None, html: bool, all_customers: bool, out_dir: str, fmt: str) -> None:
    """Show the runs over time, and what changed when the drift moved.

    One row per run (replay and compare runs, each candidate of a remedy matrix), oldest first, one table per
    path pair: drift with its 95% interval, compounded session drift, acceptance, tokens/s, the noise floor,
    the budget judged by the gate's rule, and what changed since the previous run of the same pair (config
    components, named; probe decisions or numerics). --json and --csv carry every column; --html writes pages."""
    from toolaudit.analysis.history import history

    if html or all_customers:
        if not html:
            raise click.UsageError("--all-customers goes with --html (one page per customer)")
        write_history_pages(db, (customer,) if customer else (), all_customers, ("html",), out_dir, budget,
                            path_pair, fmt == "json", "--budget", gate_rule(rule))
        return
    with reading(db) as store:
        h = history(store, path_pair or None, customer, budget, "--budget", gate_rule(rule))
    if fmt == "json":
        click.echo(to_json(h.as_dict()))
    elif fmt == "csv":
        rows = [r.as_dict() for r in h.rows]
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(list(rows[0]))
        writer.writerows([[csv_cell(row[c]) for c in rows[0]] for row in rows])
    else:
        click.echo("\n".join(history_lines(h.as_dict())))


def write_history_pages(db: str, customers: tuple[str, ...], all_customers: bool, formats: tuple[str, ...],
                        out_dir: str, budget: float | None, path_pair: tuple[str, str] | None, as_json: bool,
                        budget_source: str = "--max-call-drift", rule=None) -> None:
    """The history pages (`history --html`, and the deprecated `report --history`); prints the paths written."""
    from toolaudit.report.history import write_history
    from toolaudit.report.write import ReportError

    if customers and all_customers:
        raise click.UsageError("pass --customer C or --all-customers, not both")
    wanted = [f.strip().lower() for value in formats for f in value.split(",") if f.strip()] or ["html"]
    with reading(db) as store:
        try:
            written = write_history(store, customers or None, all_customers, list(dict.fromkeys(wanted)), out_dir,
                                    path_pair, budget, budget_source, rule)
        except ReportError as exc:
            raise click.UsageError(str(exc)) from None
    if as_json:
        click.echo(to_json({"files": [str(p) for p in written]}))
        return
    for path in written:
        click.echo(str(path))


def history_lines(h: dict[str, Any]) -> list[str]:
    """The terminal tables: a heading per path pair, then a row per run with the change in words (never cut)."""
    whose = f" for customer {h['customer']}" if h["customer"] is not None else ""
    from toolaudit.analysis.rules import Rule

    rule = Rule(h["rule"])
    budget = (f"budget {pct(h['budget'])} ({h['budget_source']}), judged on the {rule.label}"
              + ("" if rule is Rule.POINT else " of the 95% interval") if h["budget"] is not None
              else "no budget (--budget PCT)")
    lines = []
    for s in h["series"]:
        runs = s["rows"]
        lines += [f"{s['baseline']} vs {s['candidate']}{whose}: {len(runs)} run{'s' if len(runs) != 1 else ''}; "
                  f"{budget}", ""]
        columns = ["run", "created", "calls", "drift", "95% CI", "change", "session", "accept.", "tok/s", "floor",
                   "budget"]
        cells = [[f"{r['run_id']}" + ("" if r["status"] == "complete" else f" ({r['status']})"),
                  (r["created_at"] or "")[:16], r["calls"], pct(r["drift_rate"]),
                  "-" if r["ci_low"] is None else f"{pct(r['ci_low'])}-{pct(r['ci_high'])}", _delta(r),
                  pct(r["session_drift"]), pct(r["acceptance_rate"]),
                  "-" if r["candidate_tokens_per_s"] is None else f"{r['candidate_tokens_per_s']:.1f}"
                  + ("+" if r["prefill_charged"] is False else ""),
                  pct(r["floor_drift_rate"]),
                  "-" if r["within_budget"] is None else ("ok" if r["within_budget"] else "over")]
                 for r in runs]
        table = format_table(columns, cells).split("\n")
        words = ["what changed", "-" * 12] + [r["change"] for r in runs]
        lines += [f"{left}  {right}" for left, right in zip(table, words)]
        lines.append("")
    lines.append("change: the drift's change from the previous run of the pair, with * where its 95% interval "
                 "(Newcombe) excludes 0")
    if any(r["prefill_charged"] is False for s in h["series"] for r in s["rows"]):
        lines.append("tok/s+: a run before each path was charged its own prompts' prefill (migration 15): the "
                     "candidate's tok/s reads high where it reused the baseline's prompt KV")
    return lines


def _delta(r: dict[str, Any]) -> str:
    if r["drift_change"] is None:
        return "-"
    significant = r["drift_change_low"] > 0 or r["drift_change_high"] < 0
    return f"{100 * r['drift_change']:+.2f}pp" + ("*" if significant else "")
