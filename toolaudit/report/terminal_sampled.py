"""How `summary` shows a sampled run's distribution tests (`analysis/sampled.py` computes them). A call whose
outcome distribution moved is a `distribution_shift`; "drift" keeps its greedy meaning."""

from __future__ import annotations

from typing import Any

from toolaudit.report.numbers import interval, p_value, pct, signed_points, span, tv
from toolaudit.report.output import format_table
from toolaudit.store.vocabulary import NO_TOOL_CALL

TOOLS_SHOWN = 10  # tool-choice rows in the terminal


def _paired(f: dict[str, Any]) -> str:
    """`92.10% -> 85.30%: -6.80pp (95% CI -9.10pp to -4.50pp), 200 calls`."""
    if not f["calls"]:
        return "no call with samples on both sides"
    return (f"{pct(f['baseline'])} -> {pct(f['candidate'])}: {signed_points(f['difference'])} "
            f"({interval(f['low'], f['high'], signed_points)}), {f['calls']} calls")


def _left_out(s: dict[str, Any]) -> str:
    parts = [f"{n} {kind} ({side})" for side, kinds in sorted(s["samples_left_out"].items())
             for kind, n in sorted(kinds.items())]
    return ", ".join(parts) if parts else "none"


def _histogram(h: list[dict[str, Any]], width: int = 100) -> str:
    text = ", ".join(f"{e['samples']}x {e['outcome']}" for e in h)
    return text if len(text) <= width else text[: width - 3] + "..."


def _calibration_lines(c: dict[str, Any] | None) -> list[str]:
    """The floor under the same tests: the baseline against itself with other seeds should shift nothing."""
    if not c:
        return []
    return [f"  calibration           {c['path']} (the baseline, other seeds): {c['shifted_calls']} of "
            f"{c['calls_tested']} calls shifted; global p = {p_value(c['global_p'])}; median TV {tv(c['median_tv'])}"]


def _acceptance_lines(a: dict[str, Any] | None) -> list[str]:
    """How much of the candidate's output its speculative sampler decided: a defect there acts only through
    accepted proposals."""
    if not a:
        return []
    line = (f"  proposals accepted    {pct(a['rate'])} ({a['accepted']} of {a['drafted']} drafted tokens, every "
            f"sample)")
    if a["low"]:
        line += ("; so few reach the output that a defect in the speculative sampler would barely move it: no "
                 "shift here says little about the sampler")
    return [line]


def sampled_lines(s: dict[str, Any] | None, db: str | None = None) -> list[str]:
    """The sampled section of `summary`: the headline line, then the tests, the power, the paired figures, the
    most-shifted calls and the slices. Nothing for a run that is not sampled."""
    if not s:
        return []
    pw = s["power"]
    tested = s["calls_tested"]
    share = ("" if not tested else f"; shifted {s['shifted_calls']} ({pct(s['shifted_share'])} of those tested, "
             f"95% CI {pct(s['shifted_ci_low'])}-{pct(s['shifted_ci_high'])})")
    per_call = "no TV (even 1) reaches 80% power" if pw["per_call_tv"] is None else f"TV >= {tv(pw['per_call_tv'])}"
    run_tv = "-" if pw["run_tv"] is None else f"TV >= {tv(pw['run_tv'])}"
    run_n = "" if pw["samples_needed_run"] is None else f", N = {pw['samples_needed_run']} across the run's calls"
    lines = [
        f"sampled run: {s['verdict']['text']}",
        f"  {s['samples_per_call']} samples per call; {s['shifted_calls']} of {tested} calls shifted "
        f"(distribution_shift, BH q={s['q']:g}); global p = {p_value(s['global_p'])}",
        "  (judged on each call's outcome distribution; one sample against one sample, sample 0's drift, measures "
        "sampling noise at temperature > 0 and is not shown: `--as json` has it)",
        *_calibration_lines(s.get("calibration")),
        *_acceptance_lines(s.get("candidate_acceptance")),
        f"  calls tested          {tested} of {s['calls']}{share}; {s['calls_untested']} untested (fewer than 2 "
        f"usable samples a side)" + (f"; {s['calls_without_test_row']} sampled calls without a test row"
                                     if s["calls_without_test_row"] else ""),
        f"  samples left out      {_left_out(s)} (truncated and failed samples are not compared)",
        f"  global test           p = {p_value(s['global_p'])}: summed G {s['global_statistic']:.1f} over "
        f"{s['global_calls']} calls against labels permuted within each call",
        f"  median TV distance    {tv(s['median_tv'])}",
        f"  power (80%, alpha {pw['alpha']:g})  per call {per_call}; whole run, every call shifted: {run_tv}; "
        f"TV {pw['tv']:g} needs N = {pw['samples_needed_per_call']} per call{run_n}",
        "  paired by call (candidate - baseline, 95% CI over calls):",
        f"    schema-valid rate   {_paired(s['paired']['schema_valid_rate'])}",
        f"    unparseable rate    {_paired(s['paired']['unparseable_rate'])}",
        f"    no-tool-call rate   {_paired(s['paired']['no_tool_call_rate'])}",
        "",
    ]
    if s["tool_choice"]:
        # the tools of most calls first, then the largest differences: a small model sampling hot invents tool names
        tools = sorted(s["tool_choice"],
                       key=lambda t: (-t["calls"], -abs(t.get("difference") or 0.0), str(t["tool_name"])))
        more = len(tools) - TOOLS_SHOWN
        lines += ["tool choice (share of a call's samples calling the tool, over calls where either side called "
                  "it; most calls first)", _table(["tool"], ["tool_name"], tools[:TOOLS_SHOWN]),
                  *([f"  ... {more} more tools: --as json has them all"] if more > 0 else []), ""]
    if s["argument_values"]:
        lines += ["argument values (share of the tool's samples giving the value; largest differences)",
                  _table(["tool", "argument", "value"], ["tool_name", "argument", "value"], s["argument_values"]), ""]
    if s["most_shifted"]:
        lines.append("most-shifted calls (lowest p)")
        for c in s["most_shifted"]:
            lines += [f"  session {c['session_id']} call {c['call_index']} ({c['customer']}, "
                      f"{c['tool_name'] or NO_TOOL_CALL}): "
                      f"p {p_value(c['p_value'])}, q {p_value(c['q_value'])}"
                      f"{' distribution_shift' if c['shifted'] else ''}, "
                      f"TV {tv(c['tv'])} ({tv(c['tv_low'])}-{tv(c['tv_high'])})",
                      f"    baseline  ({c['n_baseline']}): {_histogram(c['baseline'])}",
                      f"    candidate ({c['n_candidate']}): {_histogram(c['candidate'])}"]
        where = f" --db {db}" if db else ""
        lines += [f"  all shifted calls: toolaudit sql \"{s['shifted_sql']}\"{where}", ""]
    for key, title in (("tool_name", "tool"), ("customer", "customer")):
        rows = s["tools" if key == "tool_name" else "customers"]
        if not rows:
            continue
        names = [(r[key] or NO_TOOL_CALL) if key == "tool_name" else r[key] for r in rows]
        lines += [format_table([title, "calls", "tested", "shifted", "shifted share", "global p", "finding"],
                               [[name, r["calls"], r["calls_tested"], r["shifted_calls"], pct(r["shifted_share"]),
                                 p_value(r["global_p"]), r["verdict"]["state"]] for name, r in zip(names, rows)]), ""]
    return lines


def _table(head: list[str], keys: list[str], rows: list[dict[str, Any]]) -> str:
    return format_table([*head, "calls", "baseline", "candidate", "difference (95% CI)"],
                        [[*(r[k] for k in keys), r["calls"], pct(r["baseline"]), pct(r["candidate"]),
                          f"{signed_points(r['difference'])} ({span(r['low'], r['high'])})"] for r in rows])
