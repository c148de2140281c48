"""How `summary` shows a sampled run's distribution tests (`analysis/sampled.py` computes them). A call whose
outcome distribution moved is a `distribution_shift`; "drift" keeps its greedy meaning."""

from __future__ import annotations

from typing import Any

from toolaudit.report.numbers import interval, p_value, pct, signed_points, span, tv
from toolaudit.report.output import format_table, more_rows
from toolaudit.store.vocabulary import NO_TOOL_CALL


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


def sampled_lines(s: dict[str, Any] | None, db: str | None = None, all_rows: bool = False,
                  more: str = "toolaudit summary --all", paths: list[dict[str, Any]] | None = None) -> list[str]:
    """The sampled section of `summary`: the finding in words, then the figures. On one screen (the default) a
    few rows per table, rows of one call (+-100 point intervals) left out, slices without a finding folded into
    one line, and `and N more: <more>` for the rest; `all_rows` (`summary --all`): every figure and row. Nothing
    for a run that is not sampled."""
    if not s:
        return []
    return _all_lines(s, db) if all_rows else _screen_lines(s, more, paths or [])


def _counts(s: dict[str, Any]) -> str:
    return (f"  {s['samples_per_call']} samples per call; {s['shifted_calls']} of {s['calls_tested']} calls shifted "
            f"(distribution_shift, BH q={s['q']:g}); global p = {p_value(s['global_p'])}")


def _power(pw: dict[str, Any]) -> str:
    per_call = "no TV (even 1) reaches 80% power" if pw["per_call_tv"] is None else f"TV >= {tv(pw['per_call_tv'])}"
    run_tv = "-" if pw["run_tv"] is None else f"TV >= {tv(pw['run_tv'])}"
    run_n = "" if pw["samples_needed_run"] is None else f", N = {pw['samples_needed_run']} across the run's calls"
    return (f"  power (80%, alpha {pw['alpha']:g})  per call {per_call}; whole run, every call shifted: "
            f"{run_tv}; TV {pw['tv']:g} needs N = {pw['samples_needed_per_call']} per call{run_n}")


def _paired_lines(s: dict[str, Any], keep_empty: bool) -> list[str]:
    """Schema-valid, unparseable and no-tool-call rates paired by call; on screen a rate that is 0 on both sides
    of every call says nothing and is left out."""
    rows = [(name, s["paired"][key]) for name, key in (("schema-valid rate", "schema_valid_rate"),
                                                       ("unparseable rate", "unparseable_rate"),
                                                       ("no-tool-call rate", "no_tool_call_rate"))]
    rows = [(n, f) for i, (n, f) in enumerate(rows)
            if keep_empty or i == 0 or f["baseline"] or f["candidate"]]
    return ["  paired by call (candidate - baseline, 95% CI over calls):",
            *(f"    {name:<19} {_paired(f)}" for name, f in rows)]


def _speed_lines(paths: list[dict[str, Any]], acceptance: dict[str, Any] | None) -> list[str]:
    """Both paths' tokens/s over every sample (the paths table in one line), the candidate's acceptance, and the
    warning of `_acceptance_lines` when so few proposals were accepted that no shift says little."""
    by_side = {p["side"]: p for p in paths}
    parts = [f"{p['path_name']} {p['tokens_per_s']:.1f} tok/s" for p in paths if p.get("tokens_per_s")]
    if not parts:
        return _acceptance_lines(acceptance)
    base, cand = by_side.get("baseline", {}), by_side.get("candidate", {})
    if base.get("tokens_per_s") and cand.get("tokens_per_s"):
        parts[-1] += f" ({cand['tokens_per_s'] / base['tokens_per_s']:.2f}x)"
    line = f"  {'speed':<21} {', '.join(parts)}"
    if cand.get("acceptance_rate") is not None:
        line += f"; acceptance {pct(cand['acceptance_rate'])}"
    errors = sum(p.get("errors") or 0 for p in paths)
    line += f"; {errors} errors" if errors else ""
    low = acceptance is not None and acceptance["low"]
    return [line, *(_acceptance_lines(acceptance) if low else [])]


def _screen_lines(s: dict[str, Any], more: str, paths: list[dict[str, Any]]) -> list[str]:
    pw = s["power"]
    counts = _counts(s) + f"; median TV {tv(s['median_tv'])}"
    per_call = "-" if pw["per_call_tv"] is None else f"TV >= {tv(pw['per_call_tv'])}"
    run_tv = "-" if pw["run_tv"] is None else f"TV >= {tv(pw['run_tv'])}"
    power = (f"  {'power (80%)':<21} per call {per_call}; whole run {run_tv}; TV {pw['tv']:g} needs N = "
             f"{pw['samples_needed_per_call']} per call")
    untested = f"{s['calls_untested']} calls untested"
    if s["calls_without_test_row"]:
        untested += f", {s['calls_without_test_row']} without a test row"
    lines = [f"sampled run: {s['verdict']['text']}", counts, *_calibration_lines(s.get("calibration")), power,
             f"  {'left out':<21} {untested}; samples: {_left_out(s)}",
             *_speed_lines(paths, s.get("candidate_acceptance")), *_paired_lines(s, keep_empty=False), ""]
    lines += _tool_choice_screen(s, more)
    lines += _argument_screen(s, more)
    lines += _most_shifted_screen(s, more)
    lines += _slices_screen(s, more)
    return lines


TOOL_ROWS_SCREEN = 2  # recorded tools' rows in the tool-choice table on screen (their fold row besides)
ARG_ROWS_SCREEN = 2
SLICE_ROWS_SCREEN = 2
SCREEN_MIN_CALLS = 2  # a row over one call has a +-100 point interval: it says nothing on screen


def _tool_choice_screen(s: dict[str, Any], more: str) -> list[str]:
    """The recorded calls' tools over two or more calls, then one row for the names no recorded call used."""
    rows = s["tool_choice"]
    if not rows:
        return []
    shown = sorted((t for t in rows if t.get("recorded", True) and t["calls"] >= SCREEN_MIN_CALLS),
                   key=lambda t: (-t["calls"], -abs(t.get("difference") or 0.0), str(t["tool_name"])))
    shown = shown[:TOOL_ROWS_SCREEN]
    other = s.get("other_tools_choice")
    table = [{**t, "name": t["tool_name"]} for t in shown]
    if other and other["calls"]:
        table.append({**other, "name": f"({other['tools']} tools no recorded call used)"})
    if not table:
        return [f"tool choice: no tool called in {SCREEN_MIN_CALLS}+ calls; all {len(rows)}: {more}", ""]
    return [_table(["tool choice (share of samples)"], ["name"], table),
            *more_rows(len(rows) - len(shown), "tools", more), ""]


def _argument_screen(s: dict[str, Any], more: str) -> list[str]:
    rows = s["argument_values"]
    if not rows:
        return []
    shown = [a for a in rows if a["calls"] >= SCREEN_MIN_CALLS][:ARG_ROWS_SCREEN]
    if not shown:
        return [f"argument values: none given in {SCREEN_MIN_CALLS}+ calls; the {len(rows)} largest differences: "
                f"{more}", ""]
    return [_table(["tool", "argument", "value (share of samples)"], ["tool_name", "argument", "value"], shown),
            *more_rows(len(rows) - len(shown), "values", more), ""]


def _most_shifted_screen(s: dict[str, Any], more: str) -> list[str]:
    """The lowest-p call, with both outcome histograms where it shifted."""
    calls = s["most_shifted"]
    if not calls:
        return []
    c = calls[0]
    lines = [f"most-shifted call: session {c['session_id']} call {c['call_index']} ({c['customer']}, "
             f"{c['tool_name'] or NO_TOOL_CALL}): p {p_value(c['p_value'])}, q {p_value(c['q_value'])}"
             f"{' distribution_shift' if c['shifted'] else ' (not shifted)'}, TV {tv(c['tv'])}"]
    if c["shifted"]:
        lines += [f"    baseline  ({c['n_baseline']}): {_histogram(c['baseline'])}",
                  f"    candidate ({c['n_candidate']}): {_histogram(c['candidate'])}"]
    return [*lines, *more_rows(len(calls) - 1, "calls", more), ""]


def _slices_screen(s: dict[str, Any], more: str) -> list[str]:
    """Per tool and per customer in one table: the slices with a finding (a shifted call, or their own global
    test under 0.05) first, the rest folded into `and N more`; one line when no slice has a finding."""
    slices = [(f"{title} {(r[key] or NO_TOOL_CALL) if key == 'tool_name' else r[key]}", r)
              for key, title, rows in (("tool_name", "tool", s["tools"]), ("customer", "customer", s["customers"]))
              for r in rows]
    if not slices:
        return []
    found = [(n, r) for n, r in slices
             if r["shifted_calls"] or (r["global_p"] is not None and r["global_p"] < 0.05)]
    if not found:
        tested = [(n, r) for n, r in slices if r["global_p"] is not None]
        low = min(tested, key=lambda nr: nr[1]["global_p"], default=None)
        lowest = "" if low is None else f"; lowest global p {p_value(low[1]['global_p'])} ({low[0]})"
        return [f"slices: {len(s['tools'])} tools, {len(s['customers'])} customers; none with a shifted call or a "
                f"global p under 0.05{lowest}"]
    found.sort(key=lambda nr: (-nr[1]["shifted_calls"], nr[1]["global_p"] if nr[1]["global_p"] is not None else 1))
    shown = found[:SLICE_ROWS_SCREEN]
    return [format_table(["slice", "calls", "tested", "shifted", "global p", "finding"],
                         [[n, r["calls"], r["calls_tested"], r["shifted_calls"], p_value(r["global_p"]),
                           r["verdict"]["state"]] for n, r in shown]),
            *more_rows(len(slices) - len(shown), "slices", more)]


def _all_lines(s: dict[str, Any], db: str | None) -> list[str]:
    """Every figure and row (`summary --all`)."""
    pw = s["power"]
    tested = s["calls_tested"]
    share = ("" if not tested else f"; shifted {s['shifted_calls']} ({pct(s['shifted_share'])} of those tested, "
             f"95% CI {pct(s['shifted_ci_low'])}-{pct(s['shifted_ci_high'])})")
    lines = [
        f"sampled run: {s['verdict']['text']}",
        _counts(s),
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
        _power(pw),
        *_paired_lines(s, keep_empty=True),
        "",
    ]
    if s["tool_choice"]:
        # the tools of most calls first, then the largest differences: a small model sampling hot invents tool names
        tools = sorted(s["tool_choice"],
                       key=lambda t: (-t["calls"], -abs(t.get("difference") or 0.0), str(t["tool_name"])))
        lines += ["tool choice (share of a call's samples calling the tool, over calls where either side called "
                  "it; most calls first)", _table(["tool"], ["tool_name"], tools), ""]
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
