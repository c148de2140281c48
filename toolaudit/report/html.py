"""The HTML rendering of a customer report: one self-contained file (inline CSS and SVG, no script, no
external asset) that opens offline. Every value from the data goes through `html.escape`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape
from typing import Any

from toolaudit.report.charts import histogram, interval_chart, outcome_histograms, session_drift_chart
from toolaudit.report.floor import html_cards
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

CSS = """
:root { --ink: #1f2937; --muted: #6b7280; --line: #e5e7eb; --soft: #f9fafb; --blue: #2563eb;
        --ok: #047857; --ok-bg: #ecfdf5; --bad: #b91c1c; --bad-bg: #fef2f2;
        --warn: #b45309; --warn-bg: #fffbeb; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--ink); background: #fff;
       font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1000px; margin: 0 auto; padding: 40px 32px 64px; }
header { border-bottom: 1px solid var(--line); padding-bottom: 20px; margin-bottom: 24px; }
.eyebrow { text-transform: uppercase; letter-spacing: .08em; font-size: 12px; color: var(--muted);
           margin: 0; }
h1 { font-size: 30px; margin: 4px 0 6px; letter-spacing: -.01em; }
h2 { font-size: 20px; margin: 40px 0 12px; padding-top: 8px; border-top: 1px solid var(--line); }
h3 { font-size: 16px; margin: 0 0 6px; }
.meta { color: var(--muted); margin: 0; font-size: 14px; }
.note { color: var(--muted); font-size: 14px; margin: 6px 0 12px; }
.muted { color: var(--muted); }
.cards { display: grid; grid-template-columns: repeat(4, 1fr); gap: 12px; margin: 0 0 20px; }
.card { border: 1px solid var(--line); border-radius: 10px; padding: 14px 16px; background: var(--soft); }
.card .label { font-size: 12px; color: var(--muted); text-transform: uppercase; letter-spacing: .05em; }
.card .value { font-size: 26px; font-weight: 650; margin: 2px 0; font-variant-numeric: tabular-nums; }
.card .sub { font-size: 13px; color: var(--muted); }
ul.findings { padding-left: 20px; margin: 0 0 8px; }
ul.findings li { margin: 4px 0; }
table { width: 100%; border-collapse: collapse; margin: 8px 0 12px; font-size: 14px; }
th, td { text-align: left; padding: 7px 10px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { background: var(--soft); font-weight: 600; font-size: 13px; color: #374151; white-space: nowrap; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
code, .mono, td.val { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
                      font-size: 13px; }
code { background: #f3f4f6; border-radius: 4px; padding: 1px 5px; overflow-wrap: break-word; }
td.val { overflow-wrap: anywhere; max-width: 320px; }
td.before { background: var(--bad-bg); }
td.after { background: var(--ok-bg); }
.badge { display: inline-block; white-space: nowrap; border-radius: 999px; padding: 1px 10px;
         font-size: 12px; font-weight: 600; }
.badge.ok { background: var(--ok-bg); color: var(--ok); }
.badge.bad { background: var(--bad-bg); color: var(--bad); }
.badge.warn { background: var(--warn-bg); color: var(--warn); }
.badge.muted { background: #f3f4f6; color: var(--muted); }
.callout { border-left: 4px solid var(--warn); background: var(--warn-bg); padding: 10px 14px;
           border-radius: 6px; margin: 12px 0; }
.empty { border: 1px dashed var(--line); border-radius: 10px; padding: 24px; text-align: center;
         color: var(--muted); background: var(--soft); }
.example { border: 1px solid var(--line); border-radius: 10px; padding: 16px 18px; margin: 14px 0; }
.example .where { color: var(--muted); font-size: 13px; margin: 0 0 8px; }
svg.chart { width: 100%; height: auto; display: block; margin: 8px 0 4px; }
details { margin: 8px 0; }
summary { cursor: pointer; color: var(--muted); }
footer { margin-top: 48px; padding-top: 16px; border-top: 1px solid var(--line); color: var(--muted);
         font-size: 13px; }
@media (max-width: 760px) { .cards { grid-template-columns: repeat(2, 1fr); } main { padding: 24px 16px; } }
@media print { main { padding: 0; } .example, table, svg { break-inside: avoid; } h2 { break-after: avoid; } }
"""


def e(value: Any) -> str:
    return escape("" if value is None else str(value), quote=True)


def code(value: Any) -> str:
    return '<span class="muted">—</span>' if value is None else f"<code>{e(value)}</code>"


def mono(value: Any, absent: str = "") -> str:
    return f'<span class="mono">{e(absent if value is None else value)}</span>'


def table(columns: Sequence[str], rows: Iterable[Sequence[str]], numeric: Iterable[int] = (),
          classes: dict[int, str] | None = None) -> str:
    """Cells are already-escaped HTML; `numeric` columns are right-aligned, `classes` styles other cells."""
    right = set(numeric)
    cls = {i: "n" for i in right} | (classes or {})
    head = "".join(f"<th{_cls('n' if i in right else None)}>{e(c)}</th>" for i, c in enumerate(columns))
    body = "".join("<tr>" + "".join(f"<td{_cls(cls.get(i))}>{cell}</td>" for i, cell in enumerate(row))
                   + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cls(name: str | None) -> str:
    return f' class="{name}"' if name else ""


def note(text: str) -> str:
    return f'<p class="note">{text}</p>'


def render_html(r: dict) -> str:
    run = r["run"]
    title = f"Tool-call drift: {r['customer']} (run {run['run_id']})"
    parts = [
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{e(title)}</title><style>{CSS}</style></head><body><main>",
        _header(r), _cards(r),
        '<ul class="findings">' + "".join(f"<li>{e(s)}</li>" for s in headline_sentences(r)) + "</ul>",
        _paths(r), _sampled(r), _routing(r), _tools(r), _arguments(r), _session_length(r), _margins(r), _examples(r),
        _footer(r), "</main></body></html>",
    ]
    return "\n".join(p for p in parts if p)


def _header(r: dict) -> str:
    run = r["run"]
    noise = ' <span class="badge warn">noise-floor run</span>' if run["noise_floor_run"] else ""
    return (f'<header><p class="eyebrow">toolaudit · structured-output drift report</p>'
            f"<h1>{e(r['customer'])}{noise}</h1>"
            f'<p class="meta">Run {e(run["run_id"])} <b>{e(run["name"])}</b> · {e(run["status"])} · '
            f"{e(run['created_at'])} UTC · candidate {code(run['candidate_name'])} against baseline "
            f"{code(run['baseline_name'])}</p></header>")


def _card(label: str, value: str, sub: str) -> str:
    return (f'<div class="card"><div class="label">{e(label)}</div><div class="value">{e(value)}</div>'
            f'<div class="sub">{e(sub)}</div></div>')


def _cards(r: dict) -> str:
    h, nf, n5 = r["headline"], r["noise_floor"], r["session_length"][4]
    sessions = (f"observed, {h['sessions']:,} sessions · compounded from own rates "
                f"{pct(h['compounded_session_drift_own_rates'])}" if h["sessions"] else "no matched sessions")
    cards = [
        _card("Sample 0 differs (noise)" if r.get("sampling") else "Drifted calls", pct(h["drift_rate"]),
              f"{h['drifted_calls']:,} of {h['calls']:,} · 95% CI {pct(h['ci_low'])}–{pct(h['ci_high'])}"),
        _card("Sessions with drift", pct(h["observed_session_drift"]) if h["sessions"] else "n/a", sessions),
        _card("5-call session", pct(n5["p"]), f"expected · 95% CI {pct(n5['low'])}–{pct(n5['high'])}"),
        *(_card(*card) for card in html_cards(nf)),
    ]
    return '<section class="cards">' + "".join(cards) + "</section>"


def _paths(r: dict) -> str:
    rows = []
    for p in r["paths"]:
        ref = p["side"] == "baseline"
        rows.append([code(p["path_name"]), e(p["side"]), f"{p['calls']:,}",
                     "reference" if ref else e(pct(p["exact_match_rate"])),
                     "reference" if ref else e(pct(p["tool_call_mismatch_rate"])), e(num(p["tokens_per_s"])),
                     "n/a" if p["acceptance_rate"] is None else e(pct(p["acceptance_rate"])),
                     f"{p['errors']:,}"])
    nf = r["noise_floor"]
    if nf:
        rows.append([code(nf["path_name"]), f"noise floor (run {e(nf['run_id'])})", f"{nf['calls']:,}",
                     e(pct(nf["exact_match_rate"])), e(pct(nf["drift_rate"])), "", "", ""])
    run = r["run"]
    out = ["<h2>Decode paths</h2>",
           note("Exact-match outputs: byte-identical raw output. Tool-call mismatch: drifted calls "
                "(reformatting and key order do not count). Acceptance: accepted / drafted speculative "
                "tokens; n/a for recorded logs and target-only paths."),
           table(["path", "role", "calls", "exact-match outputs", "tool-call mismatch", "tokens/s",
                  "acceptance", "errors"], rows, numeric=range(2, 8))]
    if not nf:
        out.append(note("No noise-floor run covers this customer: replay the baseline path against itself to "
                        "separate run-to-run nondeterminism from speculative-decoding drift."))
    out.append(table(["path", "fingerprint"], [[e(side), code(run[f"{side}_fingerprint"] or "not recorded")]
                                               for side in ("baseline", "candidate")]))
    return "\n".join(out)


def _sampled(r: dict) -> str:
    """The sampled-decoding section: this customer's distribution tests and its most-shifted calls, each with its
    two outcome histograms side by side and the outcome table. Nothing for a run that is not sampled."""
    s = r.get("sampled")
    if not s:
        note_text = sampling_note(r)
        return f'<div class="callout">{e(note_text)}</div>' if note_text else ""
    out = ['<h2 id="sampled">Sampled decoding</h2>', f'<div class="callout">{e(sampling_note(r))}</div>',
           '<ul class="findings">' + "".join(f"<li>{e(x)}</li>" for x in sampled_sentences(s)) + "</ul>",
           note("Paired by call: each call's share among its usable samples on each side, the difference "
                "(candidate − baseline) averaged over the calls with a 95% t interval."),
           table(["figure", "baseline", "candidate", "difference", "95% CI", "calls"],
                 [[e(c) for c in row] for row in paired_rows(s)], numeric=range(1, 6))]
    if not s["most_shifted"]:
        return "\n".join(out + ['<div class="empty">No call of this customer was tested.</div>'])
    out += ["<h3>Most-shifted calls</h3>",
            note("This customer's calls with the lowest p, each with the baseline's and the candidate's outcome "
                 "histograms on one axis (hover a bar or label for the full outcome).")]
    for i, call in enumerate(s["most_shifted"], 1):
        rows = outcome_rows(call)
        badge = "bad" if call["shifted"] else "muted"
        chart = outcome_histograms(rows, call["n_baseline"], call["n_candidate"],
                                   f"Outcomes of session {call['session_id']} call {call['call_index']}: baseline "
                                   "and candidate")
        out.append(f'<div class="example shifted-call" data-session="{e(call["session_id"])}" '
                   f'data-call="{e(call["call_index"])}"><h3>{i}. {code(call["tool_name"] or NO_TOOL_CALL)} '
                   f'<span class="badge {badge}">{"distribution shift" if call["shifted"] else "not shifted"}'
                   f'</span></h3><p class="where">Session {code(call["session_id"])}, call {e(call["call_index"])} · '
                   f"{e(shifted_call_head(call))}</p>{chart}"
                   + table(["outcome", "baseline samples", "candidate samples"],
                           [[mono(o), f"{b:,}", f"{c:,}"] for o, b, c in rows], numeric=(1, 2), classes={0: "val"})
                   + "</div>")
    return "\n".join(out)


def _routing(r: dict) -> str:
    if not r["routing"]:
        return ""
    rows = []
    for a in routing_rows(r):
        badge = "ok" if a["verdict"] == "candidate ok" else "bad"
        rows.append([code(a["scope"]), f"{a['calls']:,}", e(pct(a["drift_rate"])), e(pct(a["ci_high"])),
                     e(pct(a["session_upper"])), f'<span class="badge {badge}">{e(a["verdict"])}</span>',
                     e(a["reason"])])
    rest = routing_rest(r)
    return "\n".join([
        "<h2>Routing advice</h2>",
        note(f"Budget: at most {e(budget_text(r))}. Judged on the 95% Wilson upper bound (sessions: "
             "1 − (1 − upper)<sup>n</sup>): traffic stays on the candidate only where the data show it "
             "is within budget."
             + (f" {e(sampling_note(r))} The advice below judges those figures." if r.get("sampling") else "")),
        table(["scope", "calls", "drift", "upper bound", "session upper bound", "advice", "why"], rows,
              numeric=range(1, 5)),
        note(e(rest)) if rest else ""])


def _tools(r: dict) -> str:
    tools = r["tools"]
    if not tools:
        return '<h2>Drift by tool</h2><div class="empty">No matched calls.</div>'
    shown = tools[: r["settings"]["table_rows"]]
    chart = interval_chart([(t["tool_name"], t["drift_rate"], t["ci_low"], t["ci_high"]) for t in shown[:12]],
                           "Drift rate by tool with 95% interval", r["settings"]["max_call_drift"])
    rows = [[code(t["tool_name"]), f"{t['calls']:,}", f"{t['drifted_calls']:,}", e(pct(t["drift_rate"])),
             e(f"{pct(t['ci_low'])} – {pct(t['ci_high'])}"), e(kinds_text(t))] for t in shown]
    rest = tools_rest(r)
    return "\n".join(["<h2>Drift by tool</h2>", chart,
                      table(["tool", "calls", "drifted", "drift", "95% CI", "kinds"], rows,
                            numeric=range(1, 5)),
                      note(e(rest)) if rest else ""])


def _arguments(r: dict) -> str:
    if not r["arguments"]:
        return '<h2>Drift by argument</h2><div class="empty">No argument-level differences.</div>'
    rows = [[code(a["tool_name"]), code(a["arg_path"]), f"{a['calls_with_diff']:,}", e(pct(a["rate"])),
             e((a["diff_kinds"] or "").replace(",", ", ")), mono(a["example_baseline"]),
             mono(a["example_candidate"])] for a in r["arguments"]]
    return "\n".join(["<h2>Drift by argument</h2>",
                      note("Top drifting arguments; rate is calls with a difference in this argument over "
                           "the tool's calls. Example values are JSON."),
                      table(["tool", "argument", "calls", "rate", "kinds", "example baseline",
                             "example candidate"], rows, numeric=(2, 3), classes={5: "val", 6: "val"})])


def _session_length(r: dict) -> str:
    h = r["headline"]
    observed = None
    if h["sessions"] and h["mean_calls_per_session"]:
        observed = (h["mean_calls_per_session"], h["observed_session_drift"])
    chart = session_drift_chart([(s["calls"], s["p"], s["low"], s["high"]) for s in r["session_length"]],
                                observed, "Expected share of sessions with drift by session length")
    return "\n".join(["<h2>Expected drift vs session length</h2>",
                      note(f"1 − (1 − p)<sup>n</sup> at the per-call rate {e(pct(h['drift_rate']))}, band "
                           "from the 95% interval; calls treated as independent."), chart])


def _margins(r: dict) -> str:
    m, nf = r["margins"], r["noise_floor"]
    threshold = f"{m['threshold']:g}"
    out = ["<h2>First-divergence margins</h2>", f"<p>{e(margin_summary(m))}</p>"]
    if m["with_evidence"]:
        bins = [(b["label"], b["count"], b["near_tie"]) for b in m["histogram"]]
        out.append(histogram(bins, "Baseline top-1 minus top-2 logit at the first divergent token",
                             "baseline margin at first divergence (logit)", f"near-tie (< {threshold})",
                             "large margin"))
        out.append(note(f"Near-tie threshold {threshold} logit (<code>--near-tie-margin</code>): smaller "
                        "margins can flip from arithmetic alone (bf16 rounding, a different reduction "
                        "order); larger ones point at a decode-path bug."))
        if nf and nf["max_drift_margin"] is not None:
            out.append(note(f"Calibration: the largest margin among the noise-floor run's drifted calls is "
                            f"{nf['max_drift_margin']:.3g} logit."))
    elif m["drifted_calls"]:
        out.append('<div class="empty">no token evidence</div>')
    if m["large_margin"]:
        out.append(f'<div class="callout"><b>Possible decode-path bug:</b> {m["large_margin"]} drifted '
                   f"call(s) diverged where the baseline preferred its token by {threshold} logit or more. "
                   "The first examples below are those calls.</div>")
    return "\n".join(out)


def _examples(r: dict) -> str:
    if not r["examples"]:
        return '<h2>Worst examples</h2><div class="empty">No drifted calls.</div>'
    out = ["<h2>Worst examples</h2>",
           note("Large-margin divergences first, then schema breaks, then the rest.")]
    for i, x in enumerate(r["examples"], 1):
        out.append(_example(i, x))
    return "\n".join(out)


def _example(i: int, x: dict) -> str:
    attribution = "bad" if x["attribution"] == "possible decode-path bug" else "muted"
    kind = "bad" if x["drift_kind"] == "schema_broken" else "warn"
    evidence = ""
    if x["baseline_margin"] is not None:
        theirs = f" (margin {x['candidate_margin']:.3g})" if x["candidate_margin"] is not None else ""
        evidence = (f'<p class="where">First divergence at generated token {e(x["first_divergence"])}: '
                    f"baseline {code(x['baseline_token'])} (margin {x['baseline_margin']:.3g}) against "
                    f"candidate {code(x['candidate_token'])}{theirs}.</p>")
    if x["arg_diffs"]:
        body = table(["argument", "change", "baseline", "candidate"], [
            [code(d["arg_path"]), e(d["diff_kind"].replace("_", " ")), mono(d["baseline"], "(absent)"),
             mono(d["candidate"], "(absent)")] for d in x["arg_diffs"]],
                     classes={2: "val before", 3: "val after"})
    else:
        body = table(["baseline output", "candidate output"],
                     [[mono(x["baseline_output"]), mono(x["candidate_output"])]],
                     classes={0: "val before", 1: "val after"})
    return (f'<div class="example"><h3>{i}. {code(x["tool_key"])} '
            f'<span class="badge {kind}">{e(x["drift_kind"].replace("_", " "))}</span> '
            f'<span class="badge {attribution}">{e(x["attribution"])}</span></h3>'
            f'<p class="where">Session {code(x["session_id"])}, call {e(x["call_index"])} · '
            f"{e(x['detail'])}</p>{evidence}{body}</div>")


def _footer(r: dict) -> str:
    run = r["run"]
    details = []
    for side in ("baseline", "candidate"):
        comps = run.get(f"{side}_fingerprint_components")
        if comps:
            rows = [[code(k), mono(v)] for k, v in comps.items()]
            details.append(f"<details><summary>{e(side)} fingerprint components</summary>"
                           f"{table(['component', 'value'], rows)}</details>")
    margin = f"{r['settings']['near_tie_margin']:g}"
    return (f"<footer>{''.join(details)}<p>Generated by toolaudit {e(r['report']['toolaudit_version'])} at "
            f"{e(r['report']['generated_at'])} from run {e(run['run_id'])}. Near-tie threshold {e(margin)} "
            "logit. Only this customer's calls are included in any figure.</p></footer>")
