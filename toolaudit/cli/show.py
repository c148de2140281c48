"""How a run summary is shown: the text block, the path table and the worst example (or JSON / CSV)."""

from __future__ import annotations

import click

from toolaudit.cli.common import print_rows
from toolaudit.cli.show_sampled import sampled_lines
from toolaudit.compare.attribution import MISMATCH_HINT, TRUNCATION_HINT
from toolaudit.report.output import format_table, json_value, pct, to_json
from toolaudit.store.vocabulary import ArgDiffKind


def problem_lines(s: dict, db: str | None = None) -> list[str]:
    """The first error rows as `FILE:LINE: field: message`, the total and how to see them all; the schema issues
    that left calls unjudged; then the records skipped as not model calls, with their reasons."""
    lines = []
    shown = s.get("first_errors") or []
    for e in shown:
        lines.append(f"    {e['source']}:{e['line']}: {e['field'] + ': ' if e['field'] else ''}{e['message']}")
    if s["error_rows"] > len(shown):
        lines.append(f"    ... {s['error_rows'] - len(shown)} more")
    if shown:
        where = f" --db {db}" if db else ""
        lines.append(f"    all {s['error_rows']}: toolaudit sql \"{s['errors_sql']}\"{where}")
    schema = s.get("schema_problems") or {}
    if schema.get("count"):
        lines.append(f"  schema issues         {schema['count']} (validity unknown for the calls they cover)")
        for issue in schema["first"]:
            lines.append(f"    {issue['tool_name']} ({issue['schema_source']}): {issue['severity']}: "
                         f"{issue['message']}")
        if schema["count"] > len(schema["first"]):
            more = schema["count"] - len(schema["first"])
            where = f" --db {db}" if db else ""
            lines.append(f"    ... {more} more: toolaudit sql \"{s['schema_issues_sql']}\"{where}")
    for side, info in (s.get("skipped") or {}).items():
        reasons = ", ".join(f"{n} {reason}" for reason, n in list(info["reasons"].items())[:4])
        label = f"skipped ({side})"
        lines.append(f"  {label:<21} {info['count']} records, not model calls" + (f": {reasons}" if reasons else ""))
    return lines


def not_compared_lines(nc: dict) -> list[str]:
    """The paired calls left out of the figures (truncated, mismatched), each with what to do about it."""
    lines = []
    if nc.get("truncated"):
        lines.append(f"  truncated calls       {nc['truncated']} (stopped at max_tokens, not compared)")
        lines.append(f"    {TRUNCATION_HINT}")
    if nc.get("mismatched"):
        lines.append(f"  mismatched calls      {nc['mismatched']} (different requests, not compared)")
        lines.append(f"    {MISMATCH_HINT}")
    return lines


def signed(p: float) -> str:
    return f"{p * 100:+.2f}pp"


def floor_lines(f: dict | None, sampled: bool = False) -> list[str]:
    """The candidate beside its noise floor (the baseline decoded again with other batch neighbours; at
    temperature > 0 with other seeds too)."""
    if not f:
        return []
    cand, floor, ex = f["candidate"], f["floor"], f["excess"]
    how = "other batch neighbours and other seeds" if sampled else "other batch neighbours"
    return [
        f"  noise floor           {floor['drifted_calls']} ({pct(floor['drift_rate'])}, 95% CI "
        f"{pct(floor['ci_low'])}-{pct(floor['ci_high'])}): {f['floor_path']}, the baseline path with {how} "
        f"(run {f['floor_run_id']})",
        f"  beyond the floor      {signed(ex['estimate'])} (95% CI {signed(ex['low'])} to {signed(ex['high'])}), "
        f"paired on {f['calls']} calls: {f['only_candidate']} drifted on the candidate only, "
        f"{f['only_floor']} on the floor only, {f['both']} on both",
        f"                        (candidate {pct(cand['drift_rate'])} on these calls; a call the floor flips too "
        "is not the candidate's doing)",
    ]


def sampling_noise_lines(sampling: dict | None) -> list[str]:
    """The warning a run at temperature > 0 with one sample per call carries above its figures."""
    if not sampling or not sampling.get("sampling_noise"):
        return []
    return [f"  note: temperature {sampling['temperature']:g} with one sample per call: a call that differs "
            "measures sampling noise, not drift;",
            "        replay with --samples N (e.g. 16) to test whether the tool-call distribution moved "
            "(docs/statistics.md)"]


def show_summary(s: dict, fmt: str, db: str | None = None) -> None:
    if fmt == "json":
        click.echo(to_json(s))
        return
    if fmt == "csv":
        cols = list(s["customers"][0].keys()) if s["customers"] else ["customer"]
        print_rows(cols, [list(c.values()) for c in s["customers"]], "csv")
        return
    un = s["unmatched_calls"]
    # at temperature > 0 a call's two answers differ by sampling alone: the per-call figures are noise (a sampled
    # run tests its distributions below)
    drifted = "differing (noise)" if s.get("sampling") else "drifted calls"
    lines = [
        f"run {s['run_id']} ({s['run_name']}, {s['status']}): {s['baseline']} vs {s['candidate']}",
        *sampling_noise_lines(s.get("sampling")),
        f"  calls compared        {s['calls']}",
        f"  {drifted:<21} {s['drifted_calls']} ({pct(s['drift_rate'])}, 95% CI "
        f"{pct(s['ci_low'])}-{pct(s['ci_high'])})",
        f"  exact text matches    {s['exact_text_matches']}",
        "  drift kinds           " + ", ".join(f"{k}={v}" for k, v in s["drift_kinds"].items()),
        f"  sessions              {s['sessions']} (mean {s['mean_calls_per_session']:.1f} calls)",
        f"  session drift         observed {pct(s['observed_session_drift'])}, "
        f"compounded from run-wide tool rates {pct(s['compounded_session_drift_run_rates'])}",
        f"  unmatched calls       baseline only {un['baseline_only']}, candidate only {un['candidate_only']}",
        *not_compared_lines(s.get("not_compared") or {}),
        f"  error rows            {s['error_rows']}",
        *problem_lines(s, db),
        *floor_lines(s.get("noise_floor"), sampled=bool(s.get("sampling"))),
        "",
    ]
    click.echo("\n".join(lines))
    if s.get("sampled"):
        click.echo("\n".join(sampled_lines(s["sampled"], db)))
    if s.get("paths"):
        click.echo(format_table(
            ["side", "path", "calls", "tokens/s", "acceptance", "tokens/pass", "errors"],
            [[p["side"], p["path_name"], p["calls"], f"{p['tokens_per_s']:.1f}" if p["tokens_per_s"] else "-",
              pct(p["acceptance_rate"]) if p["acceptance_rate"] is not None else "-",
              f"{p['tokens_per_forward_pass']:.2f}" if p["tokens_per_forward_pass"] else "-", p["errors"]]
             for p in s["paths"]]))
        if s.get("speedup"):
            click.echo(f"  speedup (candidate vs baseline tokens/s): {s['speedup']:.2f}x")
        if s.get("drifted_with_token_evidence"):
            click.echo(f"  drifted calls with token evidence: {s['drifted_with_token_evidence']}, median "
                       f"top-2 margin at first divergence {s['median_drift_margin']:.3f} logits")
        click.echo("")
    tools = (s.get("noise_floor") or {}).get("tools") or []
    if tools:
        click.echo(format_table(
            ["tool", "calls", "drift", "floor (95% CI)", "excess (95% CI)"],
            [[t["tool_name"] or "-", t["calls"], pct(t["drift_rate"]),
              f"{pct(t['floor_drift_rate'])} ({pct(t['floor_ci_low'])}-{pct(t['floor_ci_high'])})",
              f"{signed(t['excess'])} ({signed(t['excess_ci_low'])} to {signed(t['excess_ci_high'])})"]
             for t in tools]))
        click.echo("")
    cols = ["customer", "calls", "drifted", "drift", "95% CI", "sessions", "observed", "compounded (run rates)"]
    rows = [[c["customer"], c["calls"], c["drifted_calls"], pct(c["drift_rate"]),
             f"{pct(c['ci_low'])}-{pct(c['ci_high'])}", c["sessions"], pct(c["observed_session_drift"]),
             pct(c["compounded_session_drift_run_rates"])] for c in s["customers"]]
    if s.get("noise_floor"):
        cols += ["floor", "excess (95% CI)"]
        for row, c in zip(rows, s["customers"]):
            row += ["-", "-"] if c.get("floor_drift_rate") is None else [
                pct(c["floor_drift_rate"]), f"{signed(c['excess'])} ({signed(c['excess_ci_low'])} to "
                f"{signed(c['excess_ci_high'])})"]
    click.echo(format_table(cols, rows))
    worst = s.get("worst_example")
    if worst:
        click.echo(f"\nworst example: session {worst['session_id']} call {worst['call_index']} "
                   f"({worst['customer']}, {worst['tool_name']}): {worst['drift_kind']}: {worst['detail']}")
        if worst.get("first_divergence") is not None:
            margin = worst["baseline_margin"]
            click.echo(f"  first divergent token #{worst['first_divergence']}: {json_value(worst['baseline_token'])} "
                       f"-> {json_value(worst['candidate_token'])} (baseline top-2 margin "
                       f"{'n/a' if margin is None else f'{margin:.3f}'})")
        for d in worst["arg_diffs"][:5]:
            click.echo(f"  {d['arg_path']}: {arg_value(d, 'baseline')} -> {arg_value(d, 'candidate')} "
                       f"({d['diff_kind']})")
        if not worst["arg_diffs"]:
            click.echo(f"  baseline:  {json_value((worst['baseline_text'] or '')[:160])}")
            click.echo(f"  candidate: {json_value((worst['candidate_text'] or '')[:160])}")


def arg_value(diff: dict, side: str) -> str:
    """One side's value of an argument diff as JSON (`10`, `"BRONZE"`, `null`), or `(absent)` where that side has
    no such argument (an `added` argument's baseline, a `missing` one's candidate), as the HTML report writes it."""
    value = diff[f"{side}_value"]
    if value is not None:
        return value  # stored as JSON text
    absent = ArgDiffKind.ADDED if side == "baseline" else ArgDiffKind.MISSING
    return "(absent)" if diff["diff_kind"] == absent.value else "null"
