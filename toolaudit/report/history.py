"""The canary's history as a page (`report --history`): per path pair, a chart of drift over runs with its 95% band,
the budget line and a marker on each run whose runtime changed (config, probe decisions, probe numerics), and
the table of runs under it. One self-contained HTML file (inline CSS and SVG, no script), or its JSON; a
customer's page holds that customer's figures only (`analysis.history`)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from toolaudit import __version__
from toolaudit.analysis.history import History, history
from toolaudit.analysis.rules import Rule
from toolaudit.report.charts import CHANGE_LANES, HistoryPoint, history_chart
from toolaudit.report.data import ReportError, slugs
from toolaudit.report.html import CSS, e, note
from toolaudit.report.numbers import pct
from toolaudit.report.output import to_json
from toolaudit.store import Store
from toolaudit.store.history import history_customers, history_runs

HISTORY_FORMATS = ("html", "json")
_EXTRA_CSS = """
main { max-width: 1240px; }
svg.chart { max-width: 1000px; }
.scroll { overflow-x: auto; }
td.what { min-width: 260px; }
td.when { white-space: nowrap; }
tr.changed td { background: #fffbeb; }
.chg { display: inline-block; width: 10px; height: 10px; margin-right: 4px; vertical-align: -1px; }
"""


def history_report(h: History) -> dict[str, Any]:
    """The page's data: the history (`History.as_dict`) with when and by which toolaudit it was written."""
    return {"report": {"toolaudit_version": __version__, "kind": "history",
                       "generated_at": dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()},
            **h.as_dict()}


def render_history_html(r: dict[str, Any]) -> str:
    who = r["customer"] if r["customer"] is not None else "all customers"
    title = f"Drift over time: {who}"
    rule = Rule(r["rule"])
    budget = (f"Budget {e(pct(r['budget']))} ({e(r['budget_source'])}), judged on the {e(rule.label)}"
              + ("." if rule is Rule.POINT else " of the 95% Wilson interval.") if r["budget"] is not None
              else "No budget given (<code>--max-call-drift</code>).")
    parts = ["<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{e(title)}</title><style>{CSS}{_EXTRA_CSS}</style></head><body><main>",
             '<header><p class="eyebrow">toolaudit · canary history</p>', f"<h1>{e(title)}</h1>",
             f'<p class="meta">{budget} '
             + ("Every figure is from this customer's calls only. " if r["customer"] is not None else "")
             + "One point per run, oldest first; a marker where the runtime changed since the previous run of the "
               "same path pair.</p></header>"]
    for s in r["series"]:
        parts.append(_series(s, r["budget"]))
    parts.append(f"<footer>{_legend()}<p>Generated {e(r['report']['generated_at'])} by toolaudit "
                 f"{e(r['report']['toolaudit_version'])}.</p></footer></main></body></html>")
    return "".join(parts)


def _series(s: dict[str, Any], budget: float | None) -> str:
    rows = s["rows"]
    points = [HistoryPoint(
        run_id=r["run_id"], label=f"#{r['run_id']}", date=(r["created_at"] or "")[5:10],
        p=r["drift_rate"], low=r["ci_low"], high=r["ci_high"],
        changes=tuple(k for k, _, _ in CHANGE_LANES if r[f"{k}_changed"]),
        tooltip=f"run {r['run_id']} ({r['run_name']}, {r['created_at']}): {pct(r['drift_rate'])} of {r['calls']} "
                f"calls (95% CI {pct(r['ci_low'])}-{pct(r['ci_high'])}); {r['change']}") for r in rows]
    pair = f"{s['baseline']} vs {s['candidate']}"
    chart = history_chart(points, f"Drifted calls per run, {pair}", budget)
    return (f'<section class="series" data-baseline="{e(s["baseline"])}" data-candidate="{e(s["candidate"])}">'
            f"<h2>{e(pair)}</h2>{note(f'{len(rows)} run' + ('s' if len(rows) != 1 else ''))}{chart}"
            f"{_table(rows)}</section>")


def _table(rows: Sequence[dict[str, Any]]) -> str:
    head = ["run", "created", "calls", "drift (95% CI)", "vs previous", "session drift", "accept.", "tokens/s",
            "floor", "budget", "what changed"]
    numeric = {2, 3, 4, 5, 6, 7, 8}
    out = ['<div class="scroll"><table><thead><tr>' + "".join(
        f'<th{" class=n" if i in numeric else ""}>{e(h)}</th>' for i, h in enumerate(head)) + "</tr></thead><tbody>"]
    for r in rows:
        ci = "" if r["ci_low"] is None else f" ({pct(r['ci_low'])}-{pct(r['ci_high'])})"
        delta = "-"
        if r["drift_change"] is not None:
            sig = r["drift_change_low"] > 0 or r["drift_change_high"] < 0
            delta = f"{100 * r['drift_change']:+.2f}pp" + ("*" if sig else "")
        speed = "-" if r["candidate_tokens_per_s"] is None else f"{r['candidate_tokens_per_s']:.1f}"
        if r["speedup"] is not None:
            speed += f"<br>{r['speedup']:.2f}x"
        within = "-" if r["within_budget"] is None else (
            '<span class="badge ok">within</span>' if r["within_budget"] else '<span class="badge bad">over</span>')
        swatches = "".join(f'<span class="chg" style="background:{colour}" title="{e(legend)}"></span>'
                           for kind, legend, colour in CHANGE_LANES if r[f"{kind}_changed"])
        cells = [f"{r['run_id']}<br><span class=\"muted\">{e(r['run_name'])}</span>",
                 e((r["created_at"] or "")[:10]) + "<br>" + e((r["created_at"] or "")[11:16]),
                 e(r["calls"]), e(pct(r["drift_rate"])) + "<br>" + e(ci.strip()), e(delta), e(pct(r["session_drift"])),
                 e(pct(r["acceptance_rate"])), speed, e(pct(r["floor_drift_rate"])), within,
                 swatches + e(r["change"])]
        cls = {i: "n" for i in numeric} | {1: "when", 10: "what"}
        changed = ' class="changed"' if r["changes"] else ""
        out.append(f'<tr{changed} data-run-id="{r["run_id"]}">' + "".join(
            f'<td{f" class={cls[i]}" if i in cls else ""}>{c}</td>' for i, c in enumerate(cells)) + "</tr>")
    return "".join(out) + "</tbody></table></div>"


def _legend() -> str:
    return note("Drift: drifted calls out of compared calls, with the 95% Wilson interval; vs previous: the change "
                "from the previous run of the pair, * where Newcombe's 95% interval on it excludes 0; tokens/s: the "
                "candidate's, and its speedup over the baseline; "
                "session drift: compounded from per-tool rates; noise floor: the baseline decoded again with other "
                "batch neighbours in the same run. Markers: config (a path's config fingerprint changed; the "
                "components are named), probe decisions (the path's probe chose other tokens), probe numerics "
                "(same tokens, other logprobs).")


def write_history(store: Store, customers: Sequence[str] | None, all_customers: bool, formats: Sequence[str],
                  out_dir: str | Path, path_pair: Sequence[str] | None = None, budget: float | None = None,
                  budget_source: str = "--max-call-drift", rule: Rule | None = None) -> list[Path]:
    """`report --history`: `<out>/history.<fmt>` over all customers' calls, or with customers (or all of them)
    `<out>/history/<customer>.<fmt>`, each from that customer's calls only."""
    bad = [f for f in formats if f not in HISTORY_FORMATS]
    if bad:
        raise ReportError(f"the history is written as html or json, not {bad[0]}")
    kwargs = {"budget": budget, "budget_source": budget_source} | ({"rule": rule} if rule is not None else {})
    pair = tuple(path_pair) if path_pair else (None, None)
    if all_customers:
        customers = history_customers(store, [r["run_id"] for r in history_runs(store, *pair)])
    out = Path(out_dir)
    if not customers:  # every history is built before a file is written: an unknown customer leaves nothing
        pages = [(history(store, path_pair, None, **kwargs), out / "history")]
    else:
        names = slugs(list(customers))
        pages = [(history(store, path_pair, c, **kwargs), out / "history" / names[c]) for c in customers]
    written: list[Path] = []
    for h, stem in pages:
        stem.parent.mkdir(parents=True, exist_ok=True)
        written += _write(h, stem, formats)
    return written


def _write(h: History, stem: Path, formats: Sequence[str]) -> list[Path]:
    report = history_report(h)
    written = []
    for fmt in formats:
        path = stem.with_suffix(f".{fmt}")
        path.write_text(render_history_html(report) if fmt == "html" else to_json(report) + "\n", encoding="utf-8")
        written.append(path)
    return written
