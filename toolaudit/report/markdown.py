"""The Markdown rendering of a customer report, for pasting into tickets: headings, lists and tables, no
HTML. Data values go into code spans or are escaped, so nothing in them renders as markup or splits a cell."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from toolaudit.report.floor import markdown_lines
from toolaudit.report.numbers import num, pct
from toolaudit.report.text import (
    budget_text,
    headline_sentences,
    kinds_text,
    margin_summary,
    outcome_rows,
    paired_rows,
    routing_rest,
    routing_rows,
    sampled_sentences,
    sampling_note,
    shifted_call_head,
    tools_rest,
)
from toolaudit.store.vocabulary import NO_TOOL_CALL


def md_cell(value: Any, code: bool = False) -> str:
    """A Markdown table cell on one line; data values as code spans so nothing in them renders as markup."""
    text = "" if value is None else str(value)
    text = text.replace("\r", " ").replace("\n", " ")
    if not code:
        # `\<` is a literal `<` (never a tag); backslashes doubled first so the escapes stay escapes.
        return _escape_pipes(text.replace("\\", "\\\\").replace("<", "\\<"))
    if text == "":
        return ""
    fence = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{_escape_pipes(text)}{pad}{fence}"


def _escape_pipes(text: str) -> str:
    """GFM splits cells at a pipe unless an odd run of backslashes precedes it (pairs are escaped
    backslashes). Inside code spans the extra backslash may show, but a cell never splits."""
    return re.sub(r"(\\*)\|", lambda m: m.group(1) + "\\" * (1 + len(m.group(1)) % 2) + "|", text)


def md_table(columns: Sequence[str], rows: Iterable[Sequence[str]],
              numeric: Iterable[int] = ()) -> list[str]:
    right = set(numeric)
    align = ["---:" if i in right else "---" for i in range(len(columns))]
    out = ["| " + " | ".join(columns) + " |", "| " + " | ".join(align) + " |"]
    return out + ["| " + " | ".join(row) + " |" for row in rows] + [""]


def render_markdown(r: dict) -> str:
    """Markdown for pasting into tickets: headings, lists and tables, no HTML."""
    run = r["run"]
    out = [f"# Tool-call drift: {md_cell(r['customer'])}", "",
           (f"Run {run['run_id']} ({md_cell(run['name'])}, {run['status']}, {run['created_at']} UTC): candidate "
            f"{md_cell(run['candidate_name'], True)} against baseline {md_cell(run['baseline_name'], True)}."), ""]
    out += [f"- {md_cell(s)}" for s in headline_sentences(r)] + [""]
    out += _md_paths(r)
    out += _md_sampled(r)
    if r["routing"]:
        out += ["## Routing advice", "",
                f"Budget: at most {budget_text(r)}, judged on the 95% Wilson upper bound.", ""]
        out += [f"{sampling_note(r)} The advice below judges those figures.", ""] if r.get("sampling") else []
        out += md_table(["scope", "calls", "drift", "upper bound", "session upper bound", "advice", "why"], [
            [md_cell(a["scope"], True), f"{a['calls']:,}", pct(a["drift_rate"]), pct(a["ci_high"]),
             pct(a["session_upper"]), f"**{a['verdict']}**", a["reason"]] for a in routing_rows(r)],
            numeric=range(1, 5))
        out += [routing_rest(r), ""] if routing_rest(r) else []
    out += ["## Drift by tool", ""]
    out += md_table(["tool", "calls", "drifted", "drift", "95% CI", "kinds"], [
        [md_cell(t["tool_name"], True), f"{t['calls']:,}", f"{t['drifted_calls']:,}", pct(t["drift_rate"]),
         f"{pct(t['ci_low'])} to {pct(t['ci_high'])}", md_cell(kinds_text(t))]
        for t in r["tools"][: r["settings"]["table_rows"]]], numeric=range(1, 5))
    out += [tools_rest(r), ""] if tools_rest(r) else []
    out += ["## Drift by argument", ""]
    if r["arguments"]:
        out += md_table(["tool", "argument", "calls with diff", "rate", "kinds", "example baseline",
                          "example candidate"], [
            [md_cell(a["tool_name"], True), md_cell(a["arg_path"], True), str(a["calls_with_diff"]), pct(a["rate"]),
             md_cell(a["diff_kinds"]), md_cell(a["example_baseline"], True), md_cell(a["example_candidate"], True)]
            for a in r["arguments"]], numeric=(2, 3))
    else:
        out += ["No argument-level differences.", ""]
    out += ["## Expected drift vs session length", ""]
    out += md_table(["calls", "expected", "95% CI low", "95% CI high"], [
        [str(s["calls"]), pct(s["p"]), pct(s["low"]), pct(s["high"])] for s in r["session_length"]],
        numeric=range(4))
    out += ["## First-divergence margins", "", margin_summary(r["margins"]), ""]
    if r["margins"]["with_evidence"]:
        out += md_table(["baseline margin (logit)", "drifted calls", "attribution"], [
            [b["label"], str(b["count"]), "near-tie" if b["near_tie"] else "large margin"]
            for b in r["margins"]["histogram"]], numeric=(1,))
    out += _md_examples(r)
    out += ["---", (f"Generated by toolaudit {r['report']['toolaudit_version']} at "
                    f"{r['report']['generated_at']}. Near-tie threshold {r['settings']['near_tie_margin']:g} "
                    "logit. Only this customer's calls are included in any figure."), ""]
    return "\n".join(out)


def _md_paths(r: dict) -> list[str]:
    rows = []
    for p in r["paths"]:
        ref = p["side"] == "baseline"
        rows.append([md_cell(p["path_name"], True), p["side"], f"{p['calls']:,}",
                     "reference" if ref else pct(p["exact_match_rate"]),
                     "reference" if ref else pct(p["tool_call_mismatch_rate"]), num(p["tokens_per_s"]),
                     "n/a" if p["acceptance_rate"] is None else pct(p["acceptance_rate"]), f"{p['errors']:,}",
                     md_cell(p["fingerprint"] or "not recorded", True)])
    nf = r["noise_floor"]
    if nf:
        rows.append([md_cell(nf["path_name"], True), f"noise floor (run {nf['run_id']})", f"{nf['calls']:,}",
                     pct(nf["exact_match_rate"]), pct(nf["drift_rate"]), "", "", "", ""])
    out = ["## Decode paths", ""]
    out += md_table(["path", "role", "calls", "exact-match outputs", "tool-call mismatch", "tokens/s",
                      "acceptance", "errors", "fingerprint"], rows, numeric=range(2, 8))
    return out + [x for line in markdown_lines(nf) for x in (line, "")]


def _md_sampled(r: dict) -> list[str]:
    """This customer's distribution tests and most-shifted calls (the outcome histograms as tables)."""
    s = r.get("sampled")
    if not s:
        return []
    out = ["## Sampled decoding", "", md_cell(sampling_note(r)), ""]
    out += [f"- {md_cell(x)}" for x in sampled_sentences(s)] + [""]
    out += md_table(["figure (paired by call)", "baseline", "candidate", "difference", "95% CI", "calls"],
                    paired_rows(s), numeric=range(1, 6))
    if s["most_shifted"]:
        out += ["### Most-shifted calls", "", "This customer's calls with the lowest p: samples per outcome.", ""]
    for i, call in enumerate(s["most_shifted"], 1):
        tool = md_cell(call['tool_name'] or NO_TOOL_CALL, True)
        out += [f"{i}. {tool}, session {md_cell(call['session_id'], True)}, call "
                f"{call['call_index']}: {md_cell(shifted_call_head(call))}", ""]
        out += md_table(["outcome", "baseline samples", "candidate samples"],
                        [[md_cell(o, True), str(b), str(c)] for o, b, c in outcome_rows(call)], numeric=(1, 2))
    return out


def _md_examples(r: dict) -> list[str]:
    out = ["## Worst examples", ""]
    if not r["examples"]:
        return out + ["No drifted calls.", ""]
    for i, e in enumerate(r["examples"], 1):
        out += [f"### {i}. {md_cell(e['tool_key'], True)}: {e['drift_kind']} ({e['attribution']})", "",
                f"Session {md_cell(e['session_id'], True)}, call {e['call_index']}. {md_cell(e['detail'])}", ""]
        if e["baseline_margin"] is not None:
            out += [(f"First divergence at token {e['first_divergence']}: baseline "
                     f"{md_cell(e['baseline_token'], True)} (margin {e['baseline_margin']:.3g}) against "
                     f"candidate {md_cell(e['candidate_token'], True)}."), ""]
        if e["arg_diffs"]:
            out += md_table(["argument", "change", "baseline", "candidate"], [
                [md_cell(d["arg_path"], True), d["diff_kind"], md_cell(d["baseline"], True),
                 md_cell(d["candidate"], True)] for d in e["arg_diffs"]])
        else:
            out += md_table(["baseline output", "candidate output"],
                             [[md_cell(e["baseline_output"], True), md_cell(e["candidate_output"], True)]])
    return out

