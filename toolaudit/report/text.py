"""Plain-text pieces of a report shared by the Markdown and HTML renderings: sentences, summaries, numbers.

Everything here returns unescaped text; each renderer escapes it for its own format."""

from __future__ import annotations

from toolaudit.compare.attribution import MISMATCH_HINT, TRUNCATION_HINT
from toolaudit.report.data import KIND_COLUMNS
from toolaudit.report.floor import report_sentences
from toolaudit.report.numbers import p_value, pct, signed_points, tv

NA, PTS = "n/a", " pts"  # the reports' absent figure and unit of points


def headline_sentences(r: dict) -> list[str]:
    """The figures people quote, in words; shared by the HTML and Markdown renderings."""
    h, run, nf, m = r["headline"], r["run"], r["noise_floor"], r["margins"]
    verb = "differ in sample 0 (sampling noise)" if r.get("sampling") else "drifted"
    lines = [(f"{h['drifted_calls']:,} of {h['calls']:,} tool calls {verb}: {pct(h['drift_rate'])} "
              f"(95% CI {pct(h['ci_low'])} to {pct(h['ci_high'])}), {run['candidate_name']} against "
              f"{run['baseline_name']}.")]
    if h["sessions"]:
        lines.append(f"{h['sessions_with_drift']:,} of {h['sessions']:,} sessions had at least one drifted "
                     f"call (observed {pct(h['observed_session_drift'])}); this customer's own per-tool "
                     f"rates predict {pct(h['compounded_session_drift_own_rates'])} (compounded, "
                     f"{h['mean_calls_per_session']:.1f} calls per session on average).")
    if h["error_calls"]:
        lines.append(f"{h['error_calls']:,} call(s) failed on a decode path (engine error) and are not "
                     "counted as drift; see the errors column.")
    if h.get("truncated_calls"):
        lines.append(f"{h['truncated_calls']:,} call(s) stopped at max_tokens on one side or both (truncated) and "
                     f"are not compared, nor counted in the drift rate: {TRUNCATION_HINT}.")
    if h.get("mismatched_calls"):
        lines.append(f"{h['mismatched_calls']:,} paired call(s) answer different requests (mismatched) and are "
                     f"not compared, nor counted in the drift rate: {MISMATCH_HINT}.")
    n5 = r["session_length"][4]
    lines.append(f"At this rate a 5-call session drifts with probability {pct(n5['p'])} "
                 f"(95% CI {pct(n5['low'])} to {pct(n5['high'])}).")
    lines += report_sentences(nf)
    if m["large_margin"]:
        lines.append(f"{m['large_margin']} drifted call(s) diverged at a token the baseline preferred by "
                     f"{m['threshold']:g} logit or more: possible decode-path bug, see the examples.")
    note = sampling_note(r)
    if note:
        lines.insert(0, note)
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
    return ", ".join(f"{k.replace('_', ' ')} {tool[k]}" for k in KIND_COLUMNS if tool.get(k))


def sampling_note(r: dict) -> str | None:
    """What the greedy figures of a run at temperature > 0 measure: one sample against one sample is sampling
    noise. None for greedy runs."""
    s = r.get("sampling")
    if not s:
        return None
    at = "" if s["temperature"] is None else f"temperature {s['temperature']:g}, "
    if r.get("sampled"):
        return (f"Sampled run ({at}{s['samples_per_call']} samples per call): the drift figures compare "
                f"{s['greedy_figures']}, which measures sampling noise, not drift; the sampled decoding section "
                "tests whether the tool-call distribution moved.")
    at = "" if s["temperature"] is None else f"Temperature {s['temperature']:g}, "
    return (f"{at}{'o' if at else 'O'}ne sample per call: a call that differs measures sampling noise, not drift; "
            "replay with --samples N (e.g. 16) to test whether the tool-call distribution moved.")


def sampled_sentences(s: dict) -> list[str]:
    """The customer's sampled-decoding figures in words (`analysis.sampled.customer_sampled`)."""
    tested = s["calls_tested"]
    share = ("" if not tested else f": {pct(s['shifted_share'])} (95% CI {pct(s['shifted_ci_low'])} to "
             f"{pct(s['shifted_ci_high'])})")
    lines = [f"{s['samples_per_call']} samples per call and path: {s['shifted_calls']:,} of {tested:,} calls tested "
             f"shifted (distribution_shift, Benjamini-Hochberg q = {s['q']:g} over the run's calls){share}.",
             f"Global test over this customer's {s['global_calls']:,} calls: p = {p_value(s['global_p'], NA)} "
             "(summed G "
             f"against labels permuted within each call); median TV distance {tv(s['median_tv'], NA)}."]
    if s["calls_untested"]:
        lines.append(f"{s['calls_untested']:,} call(s) untested: fewer than 2 usable samples on a side.")
    left = [f"{n} {kind} ({side})" for side, kinds in sorted(s["samples_left_out"].items())
            for kind, n in sorted(kinds.items())]
    if left:
        lines.append("Samples left out of every test and rate: " + ", ".join(left) + ".")
    pw = s["power"]
    per_call = ("no TV distance reaches 80% power" if pw["per_call_tv"] is None
                else f"a shift of TV >= {tv(pw['per_call_tv'], NA)}")
    lines.append(f"Power (80%, alpha {pw['alpha']:g}): one call's test detects {per_call}; TV {pw['tv']:g} needs "
                 f"{pw['samples_needed_per_call']} samples per call. Few shifted calls with a small N is a lower "
                 "bound, not a clean bill.")
    return lines


PAIRED_FIGURES = (("schema_valid_rate", "schema-valid rate"), ("unparseable_rate", "unparseable rate"),
                  ("no_tool_call_rate", "no-tool-call rate"))


def paired_rows(s: dict) -> list[list[str]]:
    """(figure, baseline, candidate, difference, 95% CI, calls) as text, paired by call."""
    rows = []
    for key, label in PAIRED_FIGURES:
        f = s["paired"][key]
        if not f["calls"]:
            rows.append([label, "n/a", "n/a", "n/a", "n/a", "0"])
            continue
        rows.append([label, pct(f["baseline"]), pct(f["candidate"]), signed_points(f["difference"], NA, PTS),
                     f"{signed_points(f['low'], NA, PTS)} to {signed_points(f['high'], NA, PTS)}", f"{f['calls']:,}"])
    return rows


def outcome_rows(call: dict) -> list[tuple[str, int, int]]:
    """A most-shifted call's outcomes as (outcome, baseline samples, candidate samples), most samples first."""
    b = {h["outcome"]: h["samples"] for h in call["baseline"]}
    c = {h["outcome"]: h["samples"] for h in call["candidate"]}
    return sorted(((o, b.get(o, 0), c.get(o, 0)) for o in b.keys() | c.keys()),
                  key=lambda row: (-(row[1] + row[2]), row[0]))


def shifted_call_head(call: dict) -> str:
    verdict = "distribution_shift" if call["shifted"] else "not shifted under BH"
    return (f"p {p_value(call['p_value'], NA)}, q {p_value(call['q_value'], NA)} ({verdict}), TV {tv(call['tv'], NA)} "
            f"(95% CI {tv(call['tv_low'], NA)} to {tv(call['tv_high'], NA)}), {call['n_baseline']} baseline and "
            f"{call['n_candidate']} candidate samples")
