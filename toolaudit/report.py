"""Per-customer drift reports (HTML, Markdown, JSON) built from one run.

Isolation: every figure in a customer's report comes from queries filtered to that customer's calls. Nothing
run-wide that could carry another customer's data (session ids, argument values, counts, trace errors,
schema issues) is read; the noise floor and compounded session drift are recomputed from the customer's own
calls.

Near-tie threshold (`near_tie_margin`, default 1.0 logit): a drifted call whose baseline top-1 minus top-2
margin at the first divergent token is below it is attributed to numerics, above it to a possible decode-path
bug. In bf16, logits of magnitude 16-32 are spaced 0.125 apart and a different reduction order (a batched
verification pass against one-token steps) moves them by a few such steps, i.e. a few tenths of a logit; a
1-logit lead (the top token about 2.7 times as likely as the runner-up) is beyond that noise yet far below
the margins of confident tokens. Logit and logprob margins are the same number (softmax is shift-invariant).
Calibrate it with a noise-floor run: the report shows the largest margin among its drifted calls.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from toolaudit import __version__
from toolaudit.errors import ToolauditError
from toolaudit.budgets import flatten, routing_advice, run_options
from toolaudit.output import pct, to_json
from toolaudit.stats import Rate, expected_session_drift, wilson
from toolaudit.store import Store

FORMATS = ("html", "md", "json")
NONE_CUSTOMER = "(none)"
DRIFT_KINDS = ("arguments_changed", "schema_broken", "tool_name_changed", "call_count_changed", "unparseable")
MARGIN_EDGES = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
VALUE_LIMIT = 300  # characters of an argument value or output shown in examples

# Every query below filters on this: a customer's report reads that customer's calls only.
_CUSTOMER = "coalesce(c.customer, '(none)') = ?"


class ReportError(ToolauditError):
    """A report cannot be built as asked (unknown customer, unknown format)."""


@dataclass(frozen=True)
class ReportOptions:
    near_tie_margin: float = 1.0
    max_call_drift: float | None = None
    max_session_drift: float | None = None
    session_calls: float | None = None  # default: the customer's mean calls per session
    top_arguments: int = 15
    examples: int = 8
    table_rows: int = 20  # per-tool rows shown in HTML/Markdown (JSON has them all)


def parse_formats(values: Iterable[str]) -> list[str]:
    """`("html,md", "json")` -> ["html", "md", "json"]; empty -> all three."""
    wanted: list[str] = []
    for value in values:
        for part in value.split(","):
            name = part.strip().lower()
            name = "md" if name == "markdown" else name
            if not name:
                continue
            if name not in FORMATS:
                raise ReportError(f"unknown format {part.strip()!r}; use html, md or json")
            if name not in wanted:
                wanted.append(name)
    return wanted or list(FORMATS)


def customers_of(store: Store, run_id: int) -> list[str]:
    rows = store.query("""SELECT DISTINCT coalesce(customer, '(none)') FROM calls c
        WHERE run_id = ? ORDER BY 1""", [run_id])[1]
    return [r[0] for r in rows]


def slugs(customers: Sequence[str]) -> dict[str, str]:
    """File-name-safe, unique slugs; a short hash disambiguates names that collapse to the same slug."""
    def base(name: str) -> str:
        return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:60] or "customer"

    plain = [base(c) for c in customers]
    out = {}
    for name, slug in zip(customers, plain):
        if plain.count(slug) > 1 or slug == "customer":
            slug = f"{slug}-{hashlib.sha1(name.encode()).hexdigest()[:6]}"
        out[name] = slug
    return out


def is_noise_floor(run: dict) -> bool:
    """Baseline against itself: same path names, or options say so."""
    name = run.get("baseline_name")
    same = name is not None and name == run.get("candidate_name")
    return same or run_options(run).get("noise_floor") is True


# -- data -----------------------------------------------------------------------------------------------

def customer_report(store: Store, run_id: int | None, customer: str,
                    options: ReportOptions | None = None) -> dict[str, Any]:
    """Everything one customer's report shows, as plain JSON-ready data."""
    options = options or ReportOptions()
    run = store.run_row(run_id)
    rid = run["run_id"]
    head = _headline(store, rid, customer)
    if head["calls"] == 0 and head["unmatched_calls"] == 0 and head["error_calls"] == 0:
        raise ReportError(f"customer {customer!r} has no calls in run {rid}")
    session_calls = options.session_calls or head["mean_calls_per_session"] or 1.0
    rate = wilson(head["drifted_calls"], head["calls"])
    tools = _tools(store, rid, customer)
    report = {
        "report": {"toolaudit_version": __version__,
                   "generated_at": dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()},
        "customer": customer,
        "run": _run_info(run),
        "settings": {"near_tie_margin": options.near_tie_margin, "max_call_drift": options.max_call_drift,
                     "max_session_drift": options.max_session_drift, "session_calls": session_calls,
                     "table_rows": options.table_rows},
        "headline": head,
        "paths": _paths(store, rid, customer, run, head),
        "noise_floor": _noise_floor(store, rid, customer),
        "tools": tools,
        "arguments": _arguments(store, rid, customer, options.top_arguments),
        "session_length": _session_length(rate),
        "margins": _margins(store, rid, customer, options.near_tie_margin),
        "examples": _examples(store, rid, customer, options),
        "routing": None,
    }
    if options.max_call_drift is not None or options.max_session_drift is not None:
        by_traffic = sorted(tools, key=lambda t: (-t["calls"], t["tool_name"]))
        scopes = [("all tools", rate)] + [(t["tool_name"], wilson(t["drifted_calls"], t["calls"]))
                                          for t in by_traffic]
        report["routing"] = {
            "session_calls": session_calls,
            "rows": [asdict(routing_advice(scope, r, options.max_call_drift, options.max_session_drift,
                                           session_calls)) for scope, r in scopes]}
    return report


def _session_length(rate: Rate) -> list[dict[str, float]]:
    """Expected share of sessions with drift for 1..10 calls, with the interval carried through."""
    curves = [expected_session_drift(x) for x in (rate.p, rate.low, rate.high)]
    return [{"calls": n, "p": p, "low": lo, "high": hi} for (n, p), (_, lo), (_, hi) in zip(*curves)]


def _run_info(run: dict) -> dict[str, Any]:
    opts = run_options(run)
    info = {k: run[k] for k in ("run_id", "name", "kind", "status", "baseline_name", "candidate_name",
                                "baseline_fingerprint", "candidate_fingerprint", "toolaudit_version")}
    created = run["created_at"]
    info["created_at"] = created.isoformat(sep=" ", timespec="seconds") if created else None
    info["noise_floor_run"] = is_noise_floor(run)
    for side in ("baseline", "candidate"):
        comps = opts.get(f"{side}_fingerprint_components")
        info[f"{side}_fingerprint_components"] = flatten(comps) if isinstance(comps, dict) else None
    return info


def _headline(store: Store, rid: int, customer: str) -> dict[str, Any]:
    calls, drifted, exact, unmatched, errors = store.query(f"""
        SELECT count(*) FILTER (match_status = 'matched'), count(*) FILTER (drifted),
               count(*) FILTER (match_status = 'matched' AND exact_text_match),
               count(*) FILTER (match_status IN ('baseline_only', 'candidate_only')),
               count(*) FILTER (match_status = 'error')
        FROM calls c WHERE run_id = ? AND {_CUSTOMER}""", [rid, customer])[1][0]
    # Compounded drift from this customer's own per-tool rates (the sessions table uses run-wide rates).
    sessions, with_drift, compounded, mean_calls = store.query(f"""
        WITH c AS (SELECT * FROM calls c WHERE run_id = ? AND match_status = 'matched' AND {_CUSTOMER}),
        rates AS (SELECT tool_name, avg(drifted::DOUBLE) AS p FROM c GROUP BY tool_name),
        s AS (SELECT c.session_id, count(*) AS n, bool_or(c.drifted) AS any_drift,
                     1 - product(1 - r.p) AS compounded
              FROM c JOIN rates r ON r.tool_name IS NOT DISTINCT FROM c.tool_name GROUP BY c.session_id)
        SELECT count(*), count(*) FILTER (any_drift), avg(compounded), avg(n) FROM s""",
        [rid, customer])[1][0]
    kinds = dict(store.query(f"""SELECT drift_kind, count(*) FROM calls c
        WHERE run_id = ? AND match_status = 'matched' AND {_CUSTOMER} GROUP BY 1 ORDER BY 2 DESC, 1""",
                             [rid, customer])[1])
    rate = wilson(drifted, calls)
    return {"calls": calls, "drifted_calls": drifted, "drift_rate": rate.p, "ci_low": rate.low,
            "ci_high": rate.high, "exact_text_matches": exact, "unmatched_calls": unmatched,
            "error_calls": errors,
            "drift_kinds": kinds, "sessions": sessions, "sessions_with_drift": with_drift,
            "observed_session_drift": with_drift / sessions if sessions else None,
            "compounded_session_drift": float(compounded) if compounded is not None else None,
            "mean_calls_per_session": float(mean_calls) if mean_calls is not None else None}


def _paths(store: Store, rid: int, customer: str, run: dict, head: dict) -> list[dict[str, Any]]:
    """The trade-off table: agreement and speed per decode path, NULL-safe for recorded logs."""
    rows = {r["side"]: r for r in store.rows(f"""
        WITH o AS (
            SELECT o.*, c.match_status = 'matched' AS ok
            FROM outputs o JOIN calls c USING (run_id, session_id, call_index)
            WHERE o.run_id = ? AND c.match_status IN ('matched', 'error') AND {_CUSTOMER})
        SELECT side, any_value(path_name) AS path_name, count(*) FILTER (error IS NOT NULL) AS errors,
               sum(completion_tokens) FILTER (ok AND latency_s > 0) AS timed_tokens,
               sum(latency_s) FILTER (ok AND latency_s > 0 AND completion_tokens IS NOT NULL) AS timed_s,
               avg(tokens_per_s) FILTER (ok) AS mean_tokens_per_s,
               sum(accepted_tokens) FILTER (ok) AS accepted, sum(drafted_tokens) FILTER (ok) AS drafted
        FROM o GROUP BY side""", [rid, customer])}
    out = []
    for side in ("baseline", "candidate"):
        r = rows.get(side, {})
        if r.get("timed_tokens") and r.get("timed_s"):
            tps = r["timed_tokens"] / r["timed_s"]
        else:
            tps = r.get("mean_tokens_per_s")
        drafted = r.get("drafted")
        reference = side == "baseline"
        out.append({
            "side": side, "path_name": r.get("path_name") or run[f"{side}_name"],
            "fingerprint": run[f"{side}_fingerprint"], "calls": head["calls"],
            "exact_match_rate": None if reference or not head["calls"] else
            head["exact_text_matches"] / head["calls"],
            "tool_call_mismatch_rate": None if reference or not head["calls"] else head["drift_rate"],
            "tokens_per_s": float(tps) if tps is not None else None,
            "acceptance_rate": (r["accepted"] or 0) / drafted if drafted else None,
            "errors": r.get("errors", 0)})
    return out


def _noise_floor(store: Store, rid: int, customer: str) -> dict[str, Any] | None:
    """The latest other noise-floor run, measured on this customer's calls only; None when none covers it."""
    runs = store.rows("""SELECT run_id, name, created_at, baseline_name, candidate_name, options FROM runs
                         WHERE run_id <> ? ORDER BY run_id DESC""", [rid])
    candidates = [r for r in runs if is_noise_floor(r)]
    for run in candidates:
        calls, drifted, exact, top_margin = store.query(f"""
            SELECT count(*), count(*) FILTER (drifted), count(*) FILTER (exact_text_match),
                   max(baseline_margin) FILTER (drifted)
            FROM calls c WHERE run_id = ? AND match_status = 'matched' AND {_CUSTOMER}""",
                                                        [run["run_id"], customer])[1][0]
        if calls:
            rate = wilson(drifted, calls)
            return {"run_id": run["run_id"], "run_name": run["name"],
                    "created_at": run["created_at"].isoformat(sep=" ", timespec="seconds"),
                    "path_name": run["baseline_name"], "calls": calls, "drifted_calls": drifted,
                    "drift_rate": rate.p, "ci_low": rate.low, "ci_high": rate.high,
                    "exact_match_rate": exact / calls, "max_drift_margin": top_margin}
    return None


def _tools(store: Store, rid: int, customer: str) -> list[dict[str, Any]]:
    kinds = ", ".join(f"count(*) FILTER (drift_kind = '{k}') AS {k}" for k in DRIFT_KINDS)
    rows = store.rows(f"""
        SELECT coalesce(tool_name, '(no tool call)') AS tool_name, count(*) AS calls,
               count(*) FILTER (drifted) AS drifted_calls, {kinds}
        FROM calls c WHERE run_id = ? AND match_status = 'matched' AND {_CUSTOMER}
        GROUP BY 1 ORDER BY drifted_calls DESC, calls DESC, tool_name""", [rid, customer])
    for row in rows:
        rate = wilson(row["drifted_calls"], row["calls"])
        row.update(drift_rate=rate.p, ci_low=rate.low, ci_high=rate.high)
    return rows


def _arguments(store: Store, rid: int, customer: str, limit: int) -> list[dict[str, Any]]:
    rows = store.rows(f"""
        WITH c AS (SELECT * FROM calls c WHERE run_id = ? AND match_status = 'matched' AND {_CUSTOMER}),
        per_tool AS (SELECT tool_name, count(*) AS tool_calls FROM c GROUP BY ALL)
        SELECT d.tool_name, d.arg_path, count(*) AS diffs,
               count(DISTINCT (d.session_id, d.call_index)) AS calls_with_diff, p.tool_calls,
               string_agg(DISTINCT d.diff_kind, ',' ORDER BY d.diff_kind) AS diff_kinds,
               first({{'b': d.baseline_value::VARCHAR, 'c': d.candidate_value::VARCHAR}}
                     ORDER BY d.session_id, d.call_index, d.call_position) AS example
        FROM arg_diffs d JOIN c ON c.run_id = d.run_id AND c.session_id = d.session_id
                                 AND c.call_index = d.call_index
        LEFT JOIN per_tool p ON p.tool_name IS NOT DISTINCT FROM d.tool_name
        GROUP BY d.tool_name, d.arg_path, p.tool_calls
        ORDER BY calls_with_diff DESC, d.tool_name, d.arg_path LIMIT ?""", [rid, customer, limit])
    for row in rows:
        example = row.pop("example") or {}
        row["rate"] = row["calls_with_diff"] / row["tool_calls"] if row["tool_calls"] else None
        row["example_baseline"] = _clip(example.get("b"))
        row["example_candidate"] = _clip(example.get("c"))
    return rows


def margin_bins(threshold: float) -> list[tuple[float, float]]:
    edges = sorted(set(MARGIN_EDGES) | {threshold})
    return [(lo, hi) for lo, hi in zip(edges, edges[1:] + [float("inf")])]


def _margins(store: Store, rid: int, customer: str, threshold: float) -> dict[str, Any]:
    values = [r[0] for r in store.query(f"""SELECT baseline_margin FROM calls c
        WHERE run_id = ? AND match_status = 'matched' AND drifted AND {_CUSTOMER}""", [rid, customer])[1]]
    known = [max(v, 0.0) for v in values if v is not None]
    bins = []
    for lo, hi in margin_bins(threshold):
        label = f"{lo:g}+" if hi == float("inf") else f"{lo:g}-{hi:g}"
        bins.append({"low": lo, "high": None if hi == float("inf") else hi, "label": label,
                     "count": sum(lo <= v < hi for v in known), "near_tie": hi <= threshold})
    return {"threshold": threshold, "drifted_calls": len(values), "with_evidence": len(known),
            "without_evidence": len(values) - len(known),
            "near_tie": sum(v < threshold for v in known), "large_margin": sum(v >= threshold for v in known),
            "histogram": bins}


def _examples(store: Store, rid: int, customer: str, options: ReportOptions) -> list[dict[str, Any]]:
    """The worst drifted calls: large margins first (possible bugs), then schema breaks, then the rest."""
    calls = store.rows(f"""
        SELECT session_id, call_index, coalesce(tool_name, '(no tool call)') AS tool_name, drift_kind, detail,
               first_divergence, baseline_token, candidate_token, baseline_margin, candidate_margin
        FROM calls c WHERE run_id = ? AND match_status = 'matched' AND drifted AND {_CUSTOMER}
        ORDER BY coalesce(baseline_margin >= ?, false) DESC, (drift_kind = 'schema_broken') DESC,
                 baseline_margin DESC NULLS LAST, arg_diff_count DESC, session_id, call_index
        LIMIT ?""", [rid, customer, options.near_tie_margin, options.examples])
    if not calls:
        return []
    keys = [c["session_id"] for c in calls], [c["call_index"] for c in calls]
    picked = "JOIN (SELECT unnest(?::VARCHAR[]) AS session_id, unnest(?::INTEGER[]) AS call_index) k " \
             "USING (session_id, call_index)"
    diffs: dict[tuple, list] = {}
    for d in store.rows(f"""SELECT session_id, call_index, call_position, tool_name, arg_path, diff_kind,
                                   baseline_value::VARCHAR AS baseline, candidate_value::VARCHAR AS candidate
                            FROM arg_diffs {picked} WHERE run_id = ?
                            ORDER BY call_position, arg_path""", [*keys, rid]):
        diffs.setdefault((d.pop("session_id"), d.pop("call_index")), []).append(
            {**d, "baseline": _clip(d["baseline"]), "candidate": _clip(d["candidate"])})
    outputs: dict[tuple, dict] = {}
    for o in store.rows(f"""SELECT session_id, call_index, side, coalesce(tool_calls::VARCHAR, text) AS shown
                            FROM outputs {picked} WHERE run_id = ?""", [*keys, rid]):
        outputs.setdefault((o["session_id"], o["call_index"]), {})[o["side"]] = _clip(o["shown"])
    for c in calls:
        key = (c["session_id"], c["call_index"])
        margin = c["baseline_margin"]
        c["attribution"] = ("no token evidence" if margin is None else
                            "near-tie" if margin < options.near_tie_margin else "possible decode-path bug")
        c["arg_diffs"] = diffs.get(key, [])
        c["baseline_output"] = outputs.get(key, {}).get("baseline")
        c["candidate_output"] = outputs.get(key, {}).get("candidate")
    return calls


def _clip(value: str | None, limit: int = VALUE_LIMIT) -> str | None:
    if value is None:
        return None
    return value if len(value) <= limit else value[: limit - 1] + "…"


# -- rendering ------------------------------------------------------------------------------------------

def render_json(report: dict) -> str:
    return to_json(report) + "\n"


def num(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def headline_sentences(r: dict) -> list[str]:
    """The figures people quote, in words; shared by the HTML and Markdown renderings."""
    h, run, nf, m = r["headline"], r["run"], r["noise_floor"], r["margins"]
    lines = [(f"{h['drifted_calls']:,} of {h['calls']:,} tool calls drifted: {pct(h['drift_rate'])} "
              f"(95% CI {pct(h['ci_low'])} to {pct(h['ci_high'])}), {run['candidate_name']} against "
              f"{run['baseline_name']}.")]
    if h["sessions"]:
        lines.append(f"{h['sessions_with_drift']:,} of {h['sessions']:,} sessions had at least one drifted "
                     f"call (observed {pct(h['observed_session_drift'])}); the per-tool rates predict "
                     f"{pct(h['compounded_session_drift'])} (compounded, "
                     f"{h['mean_calls_per_session']:.1f} calls per session on average).")
    if h["error_calls"]:
        lines.append(f"{h['error_calls']:,} call(s) failed on a decode path (engine error) and are not "
                     "counted as drift; see the errors column.")
    n5 = r["session_length"][4]
    lines.append(f"At this rate a 5-call session drifts with probability {pct(n5['p'])} "
                 f"(95% CI {pct(n5['low'])} to {pct(n5['high'])}).")
    if nf:
        lines.append(f"Noise floor (run {nf['run_id']}, {nf['path_name']} against itself): "
                     f"{pct(nf['drift_rate'])} of {nf['calls']:,} calls drifted "
                     f"(95% CI {pct(nf['ci_low'])} to {pct(nf['ci_high'])}).")
    if m["large_margin"]:
        lines.append(f"{m['large_margin']} drifted call(s) diverged at a token the baseline preferred by "
                     f"{m['threshold']:g} logit or more: possible decode-path bug, see the examples.")
    if run["noise_floor_run"]:
        lines.insert(0, "This is a noise-floor run: both sides use the same decode path, so any drift here "
                        "is run-to-run nondeterminism, not speculative decoding.")
    return lines


def margin_summary(m: dict) -> str:
    if not m["drifted_calls"]:
        return "No drifted calls."
    if not m["with_evidence"]:
        return (f"No token evidence: none of the {m['drifted_calls']} drifted calls has baseline token "
                f"margins (recorded logs carry none; replays with token ids do).")
    t = f"{m['threshold']:g}"
    text = (f"{m['with_evidence']} of {m['drifted_calls']} drifted calls have token evidence: "
            f"{m['near_tie']} near-tie (margin < {t}: numerics), "
            f"{m['large_margin']} large-margin (>= {t}: possible decode-path bug).")
    if m["without_evidence"]:
        text += f" {m['without_evidence']} without token evidence."
    return text


def tools_rest(r: dict) -> str | None:
    """What the capped per-tool table leaves out, in words; None when it shows every tool."""
    rest = r["tools"][r["settings"]["table_rows"]:]
    if not rest:
        return None
    calls, drifted = sum(t["calls"] for t in rest), sum(t["drifted_calls"] for t in rest)
    return f"{len(rest)} more tools with {calls:,} calls ({drifted:,} drifted) are in the JSON report."


def routing_rows(r: dict) -> list[dict]:
    """The routing rows HTML and Markdown show: the customer overall, then the busiest tools."""
    return r["routing"]["rows"][: r["settings"]["table_rows"] + 1]


def routing_rest(r: dict) -> str | None:
    rest = r["routing"]["rows"][r["settings"]["table_rows"] + 1:]
    if not rest:
        return None
    ok = sum(a["verdict"] == "candidate ok" for a in rest)
    calls = sum(a["calls"] for a in rest)
    return (f"{len(rest)} more tools with fewer calls ({calls:,} calls): {ok} candidate ok, "
            f"{len(rest) - ok} target-only; all are in the JSON report.")


def budget_text(r: dict) -> str:
    s = r["settings"]
    parts = []
    if s["max_call_drift"] is not None:
        parts.append(f"{pct(s['max_call_drift'])} of calls")
    if s["max_session_drift"] is not None:
        parts.append(f"{pct(s['max_session_drift'])} of {r['routing']['session_calls']:.1f}-call sessions")
    return " and ".join(parts)


def kinds_text(tool: dict) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {tool[k]}" for k in DRIFT_KINDS if tool.get(k))


def _md(value: Any, code: bool = False) -> str:
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


def _md_table(columns: Sequence[str], rows: Iterable[Sequence[str]],
              numeric: Iterable[int] = ()) -> list[str]:
    right = set(numeric)
    align = ["---:" if i in right else "---" for i in range(len(columns))]
    out = ["| " + " | ".join(columns) + " |", "| " + " | ".join(align) + " |"]
    return out + ["| " + " | ".join(row) + " |" for row in rows] + [""]


def render_markdown(r: dict) -> str:
    """Markdown for pasting into tickets: headings, lists and tables, no HTML."""
    run = r["run"]
    out = [f"# Tool-call drift: {_md(r['customer'])}", "",
           (f"Run {run['run_id']} ({_md(run['name'])}, {run['status']}, {run['created_at']} UTC): candidate "
            f"{_md(run['candidate_name'], True)} against baseline {_md(run['baseline_name'], True)}."), ""]
    out += [f"- {_md(s)}" for s in headline_sentences(r)] + [""]
    out += _md_paths(r)
    if r["routing"]:
        out += ["## Routing advice", "",
                f"Budget: at most {budget_text(r)}, judged on the 95% Wilson upper bound.", ""]
        out += _md_table(["scope", "calls", "drift", "upper bound", "session upper bound", "advice", "why"], [
            [_md(a["scope"], True), f"{a['calls']:,}", pct(a["drift_rate"]), pct(a["ci_high"]),
             pct(a["session_upper"]), f"**{a['verdict']}**", a["reason"]] for a in routing_rows(r)],
            numeric=range(1, 5))
        out += [routing_rest(r), ""] if routing_rest(r) else []
    out += ["## Drift by tool", ""]
    out += _md_table(["tool", "calls", "drifted", "drift", "95% CI", "kinds"], [
        [_md(t["tool_name"], True), f"{t['calls']:,}", f"{t['drifted_calls']:,}", pct(t["drift_rate"]),
         f"{pct(t['ci_low'])} to {pct(t['ci_high'])}", _md(kinds_text(t))]
        for t in r["tools"][: r["settings"]["table_rows"]]], numeric=range(1, 5))
    out += [tools_rest(r), ""] if tools_rest(r) else []
    out += ["## Drift by argument", ""]
    if r["arguments"]:
        out += _md_table(["tool", "argument", "calls with diff", "rate", "kinds", "example baseline",
                          "example candidate"], [
            [_md(a["tool_name"], True), _md(a["arg_path"], True), str(a["calls_with_diff"]), pct(a["rate"]),
             _md(a["diff_kinds"]), _md(a["example_baseline"], True), _md(a["example_candidate"], True)]
            for a in r["arguments"]], numeric=(2, 3))
    else:
        out += ["No argument-level differences.", ""]
    out += ["## Expected drift vs session length", ""]
    out += _md_table(["calls", "expected", "95% CI low", "95% CI high"], [
        [str(s["calls"]), pct(s["p"]), pct(s["low"]), pct(s["high"])] for s in r["session_length"]],
        numeric=range(4))
    out += ["## First-divergence margins", "", margin_summary(r["margins"]), ""]
    if r["margins"]["with_evidence"]:
        out += _md_table(["baseline margin (logit)", "drifted calls", "attribution"], [
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
        rows.append([_md(p["path_name"], True), p["side"], f"{p['calls']:,}",
                     "reference" if ref else pct(p["exact_match_rate"]),
                     "reference" if ref else pct(p["tool_call_mismatch_rate"]), num(p["tokens_per_s"]),
                     "n/a" if p["acceptance_rate"] is None else pct(p["acceptance_rate"]), f"{p['errors']:,}",
                     _md(p["fingerprint"] or "not recorded", True)])
    nf = r["noise_floor"]
    if nf:
        rows.append([_md(nf["path_name"], True), f"noise floor (run {nf['run_id']})", f"{nf['calls']:,}",
                     pct(nf["exact_match_rate"]), pct(nf["drift_rate"]), "", "", "", ""])
    out = ["## Decode paths", ""]
    out += _md_table(["path", "role", "calls", "exact-match outputs", "tool-call mismatch", "tokens/s",
                      "acceptance", "errors", "fingerprint"], rows, numeric=range(2, 8))
    if not nf:
        out += [("No noise-floor run covers this customer: run the baseline path against itself to separate "
                 "run-to-run nondeterminism from speculative-decoding drift."), ""]
    return out


def _md_examples(r: dict) -> list[str]:
    out = ["## Worst examples", ""]
    if not r["examples"]:
        return out + ["No drifted calls.", ""]
    for i, e in enumerate(r["examples"], 1):
        out += [f"### {i}. {_md(e['tool_name'], True)}: {e['drift_kind']} ({e['attribution']})", "",
                f"Session {_md(e['session_id'], True)}, call {e['call_index']}. {_md(e['detail'])}", ""]
        if e["baseline_margin"] is not None:
            out += [(f"First divergence at token {e['first_divergence']}: baseline "
                     f"{_md(e['baseline_token'], True)} (margin {e['baseline_margin']:.3g}) against "
                     f"candidate {_md(e['candidate_token'], True)}."), ""]
        if e["arg_diffs"]:
            out += _md_table(["argument", "change", "baseline", "candidate"], [
                [_md(d["arg_path"], True), d["diff_kind"], _md(d["baseline"], True),
                 _md(d["candidate"], True)] for d in e["arg_diffs"]])
        else:
            out += _md_table(["baseline output", "candidate output"],
                             [[_md(e["baseline_output"], True), _md(e["candidate_output"], True)]])
    return out


# -- files ----------------------------------------------------------------------------------------------

def write_reports(store: Store, run_id: int | None, customers: Sequence[str] | None, formats: Sequence[str],
                  out_dir: str | Path, options: ReportOptions | None = None) -> list[Path]:
    """Write one file per customer and format under out_dir/run-<id>/; customers=None means all."""
    from toolaudit.report_html import render_html

    rid = store.run_row(run_id)["run_id"]
    known = customers_of(store, rid)
    wanted = list(known) if customers is None else list(dict.fromkeys(customers))
    missing = [c for c in wanted if c not in known]
    if missing:
        raise ReportError(f"run {rid} has no calls for customer {missing[0]!r} "
                          f"(see `toolaudit summary --run {rid}`)")
    if not wanted:
        raise ReportError(f"run {rid} has no calls to report on")
    names = slugs(known)
    folder = Path(out_dir) / f"run-{rid}"
    folder.mkdir(parents=True, exist_ok=True)
    renderers = {"html": render_html, "md": render_markdown, "json": render_json}
    written = []
    for customer in wanted:
        report = customer_report(store, rid, customer, options)
        for fmt in formats:
            path = folder / f"{names[customer]}.{fmt}"
            path.write_text(renderers[fmt](report), encoding="utf-8")
            written.append(path)
    return written

