"""The remedy report of a matrix run for one customer: every candidate's drift and speed on that customer's
calls, the Pareto frontier, and the recommended remedy within the budget (`toolaudit.analysis.frontier`), with links to
each candidate's detailed report. Built as plain JSON-ready data; rendered in Markdown and HTML below.

Isolation as in `data.py`: every figure comes from the customer's own calls (`customer_frontier`)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from toolaudit import __version__
from toolaudit.analysis.frontier import Budget, frontier, matrix_of
from toolaudit.report.charts import FrontierPoint, frontier_chart
from toolaudit.report.data import ReportOptions
from toolaudit.report.html import CSS, code, e, note, table
from toolaudit.report.markdown import md_cell, md_table
from toolaudit.report.numbers import pct
from toolaudit.store import Store
from toolaudit.store.queries import drift_kind_counts

METHOD = ("Drift is judged against the baseline's own outputs on the same calls. Pareto-optimal: no other "
          "candidate (nor the baseline, at 0 drift and 1.0x) is at least as good on both drift and speed and "
          "better on one, on point estimates. The recommendation is the fastest candidate whose 95% Wilson "
          "upper bound is within budget (sessions: 1 - (1 - upper)^n for n calls per session), else "
          "target-only. Speeds are tokens over each of this customer's calls' share of its batch's wall time.")


METHOD_SAMPLED = ("A sampled matrix: each call decoded N times per path at temperature > 0, so sample 0's drift is "
                  "sampling noise and is not judged. A call is shifted (distribution_shift) when its candidate's "
                  "outcome distribution differs from the baseline's under Benjamini-Hochberg at q = 0.05 over the "
                  "candidate run's calls; the share is of this customer's calls tested, with its 95% Wilson interval. "
                  "Global p: the customer's summed G against labels permuted within each call. Schema-valid drop: "
                  "baseline minus candidate, paired by call, with a 95% t interval. The noise floor (the baseline "
                  "with other seeds) is the calibration: what no shift looks like at this N; it is never a remedy. "
                  "The recommendation is the fastest candidate whose shifted share's 95% Wilson upper bound is "
                  "within --max-shifted-calls, else target-only. Pareto: on the shifted share and speed.")


def remedies_report(store: Store, run_id: int | None, customer: str,
                    options: ReportOptions | None = None) -> dict[str, Any]:
    """One customer's remedy report. Each candidate's `report` (the relative path of its detailed report in
    the same format) is None here; the writer sets it per format."""
    options = options or ReportOptions()
    matrix = matrix_of(store, run_id)
    budget = Budget(options.max_call_drift, options.max_session_drift, max_shifted_calls=options.max_shifted_calls)
    f = frontier(store, matrix["run_id"], customer, budget, options.session_calls)
    members = {m["run_id"]: m for m in (store.matrix_members(matrix["run_id"]) or [matrix])}
    candidates = []
    for remedy in f.remedies:
        member = members[remedy.run_id]
        candidates.append({"candidate": remedy.candidate, "run_id": remedy.run_id,
                           "path": member["candidate_source"], "fingerprint": member["candidate_fingerprint"],
                           "drift_kinds": drift_kind_counts(store, remedy.run_id, customer),
                           "report": None})
    created = matrix["created_at"]
    return {
        "report": {"kind": "remedy_matrix", "toolaudit_version": __version__,
                   "generated_at": dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()},
        "customer": customer,
        "matrix": {"run_id": matrix["run_id"], "name": matrix["name"], "status": matrix["status"],
                   "created_at": created.isoformat(sep=" ", timespec="seconds") if created else None,
                   "baseline_name": matrix["baseline_name"], "baseline_path": matrix["baseline_source"],
                   "baseline_fingerprint": matrix["baseline_fingerprint"]},
        "settings": {"max_call_drift": options.max_call_drift, "max_session_drift": options.max_session_drift,
                     "max_shifted_calls": options.max_shifted_calls,
                     "session_calls": (f.remedies[0] if f.remedies else f.floor).session_calls},
        "frontier": f.as_dict(),
        "candidates": candidates,
        "method": METHOD_SAMPLED if f.sampled else METHOD,
    }


def _cells(r: dict) -> list[str]:
    """One remedy's table cells, as text."""
    def x(v: float | None, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    return [f"{pct(r['drift_rate'])} ({r['drifted_calls']}/{r['calls']})", f"{pct(r['ci_low'])}-{pct(r['ci_high'])}",
            pct(r["session_drift"]), pct(r["session_drift_high"]), x(r["candidate_tokens_per_s"], ".1f"),
            "-" if r["speedup"] is None else f"{r['speedup']:.2f}x",
            "-" if r["acceptance_rate"] is None else pct(r["acceptance_rate"]),
            "-" if r["pareto"] is None else ("yes" if r["pareto"] else "no"),
            "-" if r["within_budget"] is None else ("yes" if r["within_budget"] else "no")]


COLUMNS = ["candidate", "drift", "95% CI", "session drift", "session upper", "tokens/s", "speedup",
           "acceptance", "Pareto", "in budget"]


def _verdict(r: dict) -> str:
    fr = r["frontier"]
    rec = fr["recommendation"]
    if rec is None and fr.get("sampled"):
        return f"No recommendation: {fr['budget_hint']}."
    if rec is None:
        return "No budget given: pass --max-call-drift and/or --max-session-drift for a recommendation."
    note_text = f" Note: {fr['budget_hint']}." if fr.get("budget_hint") else ""
    return f"Recommended: {rec['choice']} ({rec['reason']}).{note_text}"


def _budget(r: dict) -> str:
    s = r["settings"]
    if r["frontier"].get("sampled"):
        shifted = s.get("max_shifted_calls")
        return "none" if shifted is None else f"shifted calls {pct(shifted)}"
    parts = [f"call drift {pct(s['max_call_drift'])}" if s["max_call_drift"] is not None else "",
             f"session drift {pct(s['max_session_drift'])}" if s["max_session_drift"] is not None else ""]
    return " and ".join(p for p in parts if p) or "none"


FLOOR_REFERENCE = " (noise floor: the reference, not a remedy)"
FLOOR_MARK = " (noise floor: calibration)"
SAMPLED_COLUMNS = ["candidate", "shifted", "95% CI", "global p", "median TV", "schema-valid drop (95% CI)",
                   "tokens/s", "speedup", "Pareto", "in budget"]


def _sampled_cells(r: dict) -> list[str]:
    """A sampled candidate's table cells after its name, as text."""
    s = r["sampled"] or {}
    if not s.get("calls_tested"):
        return ["-"] * 9
    p = s["global_p"]
    drop = s["valid_drop"]

    def pp(x: float) -> str:
        return f"{x * 100 + 0.0:+.2f}"  # + 0.0: no "-0.00"

    return [f"{pct(s['shifted_share'])} ({s['shifted_calls']}/{s['calls_tested']})",
            f"{pct(s['shifted_ci_low'])}-{pct(s['shifted_ci_high'])}",
            "-" if p is None else f"{p:.2g}" if p < 0.001 else f"{p:.3f}",
            "-" if s["median_tv"] is None else f"{s['median_tv']:.2f}",
            "-" if drop is None else f"{pp(drop)} ({pp(s['valid_drop_ci_low'])} to {pp(s['valid_drop_ci_high'])}) pts",
            "-" if r["candidate_tokens_per_s"] is None else f"{r['candidate_tokens_per_s']:.1f}",
            "-" if r["speedup"] is None else f"{r['speedup']:.2f}x",
            "-" if r["pareto"] is None else ("yes" if r["pareto"] else "no"),
            "-" if r["within_budget"] is None else ("yes" if r["within_budget"] else "no")]


def _rows(fr: dict) -> list[dict]:
    """The candidates' rows, then the noise floor's as their reference (never a remedy: no budget verdict)."""
    return [*fr["remedies"], *([fr["noise_floor"]] if fr.get("noise_floor") else [])]


def render_remedies_markdown(r: dict) -> str:
    m, fr = r["matrix"], r["frontier"]
    out = [f"# Remedies: {md_cell(r['customer'])}", "",
           (f"Matrix run {m['run_id']} ({md_cell(m['name'])}, {m['status']}, {m['created_at']} UTC): "
            f"{len(fr['remedies'])} candidates against baseline {md_cell(m['baseline_name'], True)} on the same "
            f"calls. Budget: {_budget(r)}; sessions of {r['settings']['session_calls']:.1f} calls."), "",
           f"**{md_cell(_verdict(r))}**", ""]
    base = next((x["baseline_tokens_per_s"] for x in fr["remedies"] if x["baseline_tokens_per_s"]), None)
    if base:
        out += [f"Baseline speed: {base:.1f} tokens/s.", ""]
    if fr.get("sampled"):
        out += md_table(SAMPLED_COLUMNS, [[md_cell(x["candidate"], True) + (FLOOR_MARK if x["noise_floor"] else ""),
                                           *_sampled_cells(x)] for x in _rows(fr)], numeric=range(1, 8))
    else:
        out += md_table(COLUMNS, [[md_cell(x["candidate"], True) + (FLOOR_REFERENCE if x["noise_floor"] else ""),
                                   *_cells(x)] for x in _rows(fr)], numeric=range(1, 8))
    out += [md_cell(r["method"]), "", "## Candidates", ""]
    for c in r["candidates"]:
        kinds = ", ".join(f"{k} {n}" for k, n in c["drift_kinds"].items()) or "no drift"
        link = f" Details: [{c['report']}]({c['report']})." if c["report"] else ""
        out.append(f"- {md_cell(c['candidate'], True)} (run {c['run_id']}): {md_cell(c['path'])}; drift kinds: "
                   f"{md_cell(kinds)}.{link}")
    out += ["", f"Generated by toolaudit {r['report']['toolaudit_version']} at {r['report']['generated_at']}. "
            "Only this customer's calls are included in any figure.", ""]
    return "\n".join(out)


def render_remedies_html(r: dict) -> str:
    m, fr = r["matrix"], r["frontier"]
    title = f"Remedies: {r['customer']} (matrix run {m['run_id']})"
    rec = fr["recommendation"]
    badge = ("" if rec is None else
             f' <span class="badge {"ok" if rec["choice"] != "target-only" else "warn"}">{e(rec["choice"])}</span>')
    if fr.get("sampled"):
        columns = SAMPLED_COLUMNS
        rows = [[code(x["candidate"]) + (e(FLOOR_MARK) if x["noise_floor"] else ""), *map(e, _sampled_cells(x))]
                for x in _rows(fr)]
        points = [FrontierPoint(x["candidate"], x["speedup"], x["sampled"]["shifted_share"],
                                x["sampled"]["shifted_ci_low"], x["sampled"]["shifted_ci_high"], bool(x["pareto"]))
                  for x in fr["remedies"] if x["speedup"] is not None and not x["noise_floor"]
                  and (x["sampled"] or {}).get("calls_tested")]
        chart = (frontier_chart(points, f"Shifted calls against speedup, {r['customer']}",
                                r["settings"].get("max_shifted_calls"), "shifted calls", "shifted-call budget")
                 if points else "")
    else:
        columns = COLUMNS
        rows = [[code(x["candidate"]) + (e(FLOOR_REFERENCE) if x["noise_floor"] else ""),
                 *(e(c) for c in _cells(x))] for x in _rows(fr)]
        points = [FrontierPoint(x["candidate"], x["speedup"], x["drift_rate"], x["ci_low"], x["ci_high"],
                                bool(x["pareto"])) for x in fr["remedies"] if x["speedup"] is not None]
        chart = (frontier_chart(points, f"Drift against speedup, {r['customer']}", r["settings"]["max_call_drift"])
                 if points else note("Speeds were not measured (recorded logs): no frontier chart."))
    items = []
    for c in r["candidates"]:
        kinds = ", ".join(f"{k} {n}" for k, n in c["drift_kinds"].items()) or "no drift"
        link = f' · <a href="{e(c["report"])}">detailed report</a>' if c["report"] else ""
        items.append(f"<li>{code(c['candidate'])} (run {e(c['run_id'])}): {e(c['path'] or '')}; drift kinds: "
                     f"{e(kinds)}{link}</li>")
    parts = [
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{e(title)}</title><style>{CSS}</style></head><body><main>",
        f'<header><p class="eyebrow">toolaudit · remedy matrix</p><h1>{e(r["customer"])}{badge}</h1>'
        f'<p class="meta">Matrix run {e(m["run_id"])} <b>{e(m["name"])}</b> · {e(m["status"])} · '
        f"{e(m['created_at'])} UTC · {len(fr['remedies'])} candidates against baseline "
        f"{code(m['baseline_name'])}</p></header>",
        f'<p class="callout">{e(_verdict(r))}</p>',
        note(f"Budget: {e(_budget(r))}; session figures for {r['settings']['session_calls']:.1f} calls per "
             "session."),
        "<h2>Frontier</h2>", chart,
        table(columns, rows, numeric=range(1, 8)),
        note(e(r["method"])),
        "<h2>Candidates</h2>", "<ul>" + "".join(items) + "</ul>",
        f"<footer><p>Generated by toolaudit {e(r['report']['toolaudit_version'])} at "
        f"{e(r['report']['generated_at'])} from matrix run {e(m['run_id'])}. Only this customer's calls are "
        "included in any figure.</p></footer>",
        "</main></body></html>",
    ]
    return "\n".join(parts)
