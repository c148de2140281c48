"""A run's summary on the terminal: the verdict in words, the paths, a few rows per table with "and N more",
the worst example; one screen (`summary --all`: every row)."""

from __future__ import annotations

from toolaudit.compare.attribution import MISMATCH_HINT, TRUNCATION_HINT
from toolaudit.report.floor import (
    CUSTOMER_COLUMNS,
    TOOL_COLUMNS,
    customer_cells,
    floor_lines,
    floor_verdict,
    tool_cells,
)
from toolaudit.report.numbers import pct
from toolaudit.report.output import format_table, json_value, more_rows
from toolaudit.report.terminal_sampled import sampled_lines
from toolaudit.store.vocabulary import NO_TOOL_CALL, ArgDiffKind


def problem_lines(s: dict, db: str | None = None) -> list[str]:
    """The first error rows as `FILE:LINE: field: message`, the total and how to see them all; the schema issues
    that left calls unjudged; the probes the replay could not take, with why; then the records skipped as not
    model calls, with their reasons."""
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
    for probe in s.get("probes_unavailable") or []:
        lines.append(f"  probe unavailable     {probe['side']} {probe['path_name']}: {probe['reason']}")
    for side, info in (s.get("skipped") or {}).items():
        reasons = ", ".join(f"{n} {reason}" for reason, n in list(info["reasons"].items())[:4])
        label = f"skipped ({side})"
        lines.append(f"  {label:<21} {info['count']} records, not model calls" + (f": {reasons}" if reasons else ""))
    return lines


def not_compared_lines(nc: dict) -> list[str]:
    """The paired calls left out of the figures (truncated, mismatched), each with what to do about it."""
    lines = []
    if nc.get("truncated"):
        lines.append(f"  truncated calls       {nc['truncated']} (stopped at max_tokens, not compared): "
                     f"{TRUNCATION_HINT}")  # one line: the demo's summary fits one screen
    if nc.get("mismatched"):
        lines.append(f"  mismatched calls      {nc['mismatched']} (different requests, not compared)")
        lines.append(f"    {MISMATCH_HINT}")
    return lines


# One screen: a plain run's summary is at most about 32 lines. Each table shows a few rows, then `and N more:` with
# the command that shows them all (`summary --all`); `--json` has every row.
TOOL_ROWS = 3  # rows of the per-tool table, a folded row counted
SMALL_TOOL_CALLS = 5  # a tool with fewer compared calls says nothing alone: folded with the other small ones
CUSTOMER_ROWS = 4
ARG_DIFF_ROWS = 2


def more_command(s: dict, db: str | None) -> str:
    """The command that shows every row of this run's tables."""
    import shlex

    return f"toolaudit summary --run {s['run_id']} --all" + (f" --db {shlex.quote(db)}" if db else "")


def more_line(n: int, what: str, s: dict, db: str | None) -> list[str]:
    return more_rows(n, what, more_command(s, db))


def _lengths(s: dict) -> str:
    """Both session lengths, named: as replayed here, and as recorded in the traces (when a replay sampled)."""
    replayed = f"{s['calls_per_session_replayed']:.1f} calls per session replayed"
    recorded = s.get("calls_per_session_recorded")
    return replayed if recorded is None else f"{replayed}, {recorded:.1f} recorded"


def verdict(s: dict) -> str:
    """What the headline figures mean, in one sentence: the speedup, and the drift against the noise floor."""
    speed = f"{s['speedup']:.2f}x the baseline's tokens/s; " if s.get("speedup") else ""
    head = f"{s['candidate']}: {speed}"
    if s.get("noise_floor_run"):
        return (f"{head}a noise-floor run: both sides decode the baseline path, so what differs is run-to-run "
                "nondeterminism, not the candidate's doing")
    if s.get("sampling"):
        return (f"{head}one sample against one sample measures sampling noise, not drift"
                + (" (the sampled figures below test the distributions)" if s.get("sampled") else ""))
    if not s["drifted_calls"]:
        return f"{head}no call drifted (the 95% CI reaches {pct(s['ci_high'])}; more calls narrow it)"
    f = s.get("noise_floor")
    if f:
        return head + floor_verdict(f)
    return (f"{head}{s['drifted_calls']} calls drifted; without a noise floor, how many are run-to-run noise is "
            "unknown (replay --noise-floor measures it)")


def sampling_noise_lines(sampling: dict | None) -> list[str]:
    """The warning a run at temperature > 0 with one sample per call carries above its figures."""
    if not sampling or not sampling.get("sampling_noise"):
        return []
    return [f"  note: temperature {sampling['temperature']:g} with one sample per call: a call that differs "
            "measures sampling noise, not drift;",
            "        replay with --samples N (e.g. 16) to test whether the tool-call distribution moved "
            "(docs/statistics.md)"]


def head_lines(s: dict, db: str | None) -> list[str]:
    """The verdict first (drifted of compared, the floor figures, what they mean), then the details
    that stay one line each; what was not compared only when something was not."""
    un = s["unmatched_calls"]
    # at temperature > 0 a call's two answers differ by sampling alone: the per-call figures are noise (a sampled
    # run tests its distributions below)
    drifted = "differing (noise)" if s.get("sampling") else "drifted calls"
    kinds = ", ".join(f"{k}={v}" for k, v in s["drift_kinds"].items())
    lines = [
        f"run {s['run_id']} ({s['run_name']}, {s['status']}): {s['baseline']} vs {s['candidate']}",
        *sampling_noise_lines(s.get("sampling")),
        f"  {drifted:<21} {s['drifted_calls']} of {s['calls']} compared ({pct(s['drift_rate'])}, 95% CI "
        f"{pct(s['ci_low'])}-{pct(s['ci_high'])})",
        *floor_lines(s.get("noise_floor"), sampled=bool(s.get("sampling"))),
        f"  verdict               {verdict(s)}",
        f"  drift kinds           {kinds or '-'}; {s['exact_text_matches']} exact text matches",
        f"  sessions              {s['sessions']} ({_lengths(s)}): session drift "
        f"observed {pct(s['observed_session_drift'])}, compounded from run-wide tool rates "
        f"{pct(s['compounded_session_drift_run_rates'])}",
    ]
    if un["baseline_only"] or un["candidate_only"]:
        lines.append(f"  unmatched calls       baseline only {un['baseline_only']}, candidate only "
                     f"{un['candidate_only']}")
    lines += not_compared_lines(s.get("not_compared") or {})
    if s["error_rows"]:
        lines.append(f"  error rows            {s['error_rows']}")
    return lines + problem_lines(s, db)


def path_lines(s: dict) -> list[str]:
    if not s.get("paths"):
        return []
    lines = [format_table(
        ["side", "path", "calls", "tokens/s", "acceptance", "tokens/pass", "errors"],
        [[p["side"], p["path_name"], p["calls"], f"{p['tokens_per_s']:.1f}" if p["tokens_per_s"] else "-",
          pct(p["acceptance_rate"]) if p["acceptance_rate"] is not None else "-",
          f"{p['tokens_per_forward_pass']:.2f}" if p["tokens_per_forward_pass"] else "-", p["errors"]]
         for p in s["paths"]])]
    return lines


def tool_rows_on_screen(rows: list[dict], all_rows: bool) -> tuple[list[dict], int]:
    """(the rows shown, how many tools are not shown as a row of their own). On one screen: the busiest tools
    with at least SMALL_TOOL_CALLS calls, the rest folded into one row with their calls' figures together."""
    from toolaudit.analysis.figures import fold_tool_rows

    if all_rows:
        return rows, 0
    big = [r for r in rows if r["calls"] >= SMALL_TOOL_CALLS]
    small = [r for r in rows if r["calls"] < SMALL_TOOL_CALLS]
    if len(rows) <= TOOL_ROWS and len(small) <= 1:
        return rows, 0
    shown = big[:TOOL_ROWS - 1]
    rest = big[TOOL_ROWS - 1:] + small
    if len(rest) == 1:
        return shown + rest, 0
    name = (f"({len(rest)} tools with < {SMALL_TOOL_CALLS} calls)" if len(rest) == len(small)
            else f"({len(rest)} more tools)")
    return [*shown, fold_tool_rows(rest, name)], len(rest)


def tool_lines(s: dict, db: str | None, all_rows: bool) -> list[str]:
    """Per tool, keyed by the recorded call's tool (`tool_key`), beside the floor when the run has one."""
    floor = s.get("noise_floor")
    rows = (floor.get("tools_keyed") if floor else s.get("tools")) or []
    if not rows:
        return []
    rows, hidden = tool_rows_on_screen(rows, all_rows)
    # a decoded baseline's names: those no schema knows are one `(other)` row, under a header that says so
    tool = "declared tool" if s.get("tool_key") == "declared" else "tool"
    if floor:
        table = format_table([tool, "calls", "drift", *TOOL_COLUMNS],
                             [[t["tool_name"] or NO_TOOL_CALL, t["calls"], pct(t["drift_rate"]), *tool_cells(t)]
                              for t in rows])
    else:
        table = format_table(
            [tool, "calls", "drifted", "drift", "95% CI"],
            [[t["tool_name"] or NO_TOOL_CALL, t["calls"], t["drifted_calls"], pct(t["drift_rate"]),
              f"{pct(t['ci_low'])}-{pct(t['ci_high'])}"] for t in rows])
    return [table, *more_line(hidden, "tools", s, db)]


def customer_lines(s: dict, db: str | None, all_rows: bool) -> list[str]:
    """Per customer; on one screen the busiest few."""
    customers = s["customers"]
    hidden = 0
    if not all_rows and len(customers) > CUSTOMER_ROWS:
        busiest = sorted(customers, key=lambda c: -c["calls"])[:CUSTOMER_ROWS - 1]
        customers = [c for c in customers if c in busiest]
        hidden = len(s["customers"]) - len(customers)
    cols = ["customer", "calls", "drifted", "drift", "95% CI", "sessions", "observed", "compounded (run rates)"]
    rows = [[c["customer"], c["calls"], c["drifted_calls"], pct(c["drift_rate"]),
             f"{pct(c['ci_low'])}-{pct(c['ci_high'])}", c["sessions"], pct(c["observed_session_drift"]),
             pct(c["compounded_session_drift_run_rates"])] for c in customers]
    if s.get("noise_floor"):
        cols += CUSTOMER_COLUMNS
        for row, c in zip(rows, customers):
            row += customer_cells(c)
    return [format_table(cols, rows), *more_line(hidden, "customers", s, db)]


def worst_lines(s: dict, db: str | None, all_rows: bool) -> list[str]:
    worst = s.get("worst_example")
    if not worst:
        return []
    tool = worst["tool_key"] or NO_TOOL_CALL  # the per-tool tables' key: the recorded call's tool where known
    lines = [f"worst example: session {worst['session_id']} call {worst['call_index']} "
             f"({worst['customer']}, {tool}): {worst['drift_kind']}: {worst['detail']}"]
    evidence = s.get("drifted_with_token_evidence")
    median = (f"median {s['median_drift_margin']:.3f} logits over the {evidence} drifted calls with token evidence"
              if evidence else "")
    if worst.get("first_divergence") is not None:
        margin = worst["baseline_margin"]
        lines.append(f"  first divergent token #{worst['first_divergence']}: {json_value(worst['baseline_token'])} "
                     f"-> {json_value(worst['candidate_token'])} (baseline top-2 margin "
                     f"{'n/a' if margin is None else f'{margin:.3f}'}{'; ' + median if median else ''})")
    elif evidence:
        lines.append(f"  first divergence: {median}")
    diffs = worst["arg_diffs"]
    if not all_rows and len(diffs) > ARG_DIFF_ROWS:  # the last row is `and N more`
        diffs = diffs[:ARG_DIFF_ROWS - 1]
    for d in diffs:
        lines.append(f"  {d['arg_path']}: {arg_value(d, 'baseline')} -> {arg_value(d, 'candidate')} "
                     f"({d['diff_kind']})")
    lines += more_line(len(worst["arg_diffs"]) - len(diffs), "argument diffs", s, db)
    if not worst["arg_diffs"]:
        lines.append(f"  baseline:  {json_value((worst['baseline_text'] or '')[:160])}")
        lines.append(f"  candidate: {json_value((worst['candidate_text'] or '')[:160])}")
    return lines


def summary_lines(s: dict, db: str | None = None, all_rows: bool = False) -> list[str]:
    """A run's summary as text that fits one screen (`all_rows`: every row of every table). A sampled run is
    judged on its distributions: no drift-style figures, tables or worst example."""
    if s.get("sampled"):
        if all_rows:
            return [head_lines(s, db)[0], *sampled_lines(s["sampled"], db, True), *path_lines(s)]
        return [head_lines(s, db)[0], *sampled_lines(s["sampled"], db, more=more_command(s, db), paths=s["paths"])]
    lines = [*head_lines(s, db), ""]
    for block in (path_lines(s), tool_lines(s, db, all_rows), customer_lines(s, db, all_rows)):
        if block:
            lines += [*block, ""]
    return lines + worst_lines(s, db, all_rows)


def arg_value(diff: dict, side: str) -> str:
    """One side's value of an argument diff as JSON (`10`, `"BRONZE"`, `null`), or `(absent)` where that side has
    no such argument (an `added` argument's baseline, a `missing` one's candidate), as the HTML report writes it."""
    value = diff[f"{side}_value"]
    if value is not None:
        return value  # stored as JSON text
    absent = ArgDiffKind.ADDED if side == "baseline" else ArgDiffKind.MISSING
    return "(absent)" if diff["diff_kind"] == absent.value else "null"
