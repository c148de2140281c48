"""The reporting views, generated from the drift vocabulary (`store.vocabulary.DriftKind`, `MatchStatus`) so the
SQL can never spell a kind or status differently from the code that writes it.

Aggregates whose result depends on input order (floating averages, examples) take their rows in a fixed
order (session, call), so a run merged from shards reads exactly as the unsharded run.

Migrations apply these with CREATE OR REPLACE; a change to a view needs a new numbered migration that calls
`views_sql()` again, and the builders take the `version` of the migration that calls them, so a released
migration keeps creating the views it created (e.g. `path_performance` read `replay_batches` before 8).

Two compounded session figures exist and carry two names: `customer_drift` has
`compounded_session_drift_run_rates`, the RUN-WIDE per-tool drift rates applied to each session (the mean of
`sessions.compounded_p`, what `summary` shows). A customer's report shows `compounded_session_drift_own_rates`,
the customer's OWN per-tool rates (it does not depend on other customers' traffic); the view leaves it out: its
exact, order-fixed products doubled `summary`'s time on 2M calls (1.1 -> 2.1 s).
"""

from __future__ import annotations

from toolaudit.store.vocabulary import DRIFTED_KINDS, MatchStatus

MATCHED = f"match_status = '{MatchStatus.MATCHED.value}'"
# The migration that last changed a view; builders given an older `version` create the view as it was then.
LATEST = 16
NAMES_SPLIT = 8  # replay_batches -> replay_chunks; the two compounded figures named apart
SPEED_UNIFIED = 13  # the frontier views' tokens/s and acceptance: every decoded call (`analysis.speed`)
FLOOR_APART = 14  # the frontier views name the noise-floor member and leave it out of `pareto` (a reference)
PREFILL_CHARGED = 15  # replay_chunks.reused_prefill_s: the part of wall_s that is prefill other paths ran
EVERY_SAMPLE = 16  # the frontier views' speed: every sample of a sampled call, over the call's stored wall share
# A run of the baseline against itself (`analysis.floor.is_noise_floor`): the same path names, or its options say so.
IS_FLOOR = ("(coalesce(baseline_name = candidate_name, false) "
            "OR coalesce(json_extract_string(options, '$.noise_floor') = 'true', false))")


def _call_drift() -> str:
    return f"""
CREATE OR REPLACE VIEW call_drift AS
SELECT c.run_id, r.name AS run_name, c.session_id, c.call_index, coalesce(c.customer, '(none)') AS customer,
       c.tool_name, c.drift_kind, c.drifted, c.exact_text_match, c.baseline_valid, c.candidate_valid,
       c.arg_diff_count, c.detail
FROM calls c JOIN runs r USING (run_id)
WHERE c.{MATCHED};"""


def _session_drift() -> str:
    return """
CREATE OR REPLACE VIEW session_drift AS
SELECT s.run_id, r.name AS run_name, s.session_id, coalesce(s.customer, '(none)') AS customer, s.calls,
       s.matched_calls, s.drifted_calls, s.any_drift, s.compounded_p
FROM sessions s JOIN runs r USING (run_id);"""


def _tool_drift() -> str:
    per_kind = ",\n       ".join(f"count(*) FILTER (drift_kind = '{k.value}') AS {k.value}" for k in DRIFTED_KINDS)
    return f"""
CREATE OR REPLACE VIEW tool_drift AS
SELECT run_id, tool_name, count(*) AS calls, count(*) FILTER (drifted) AS drifted_calls,
       count(*) FILTER (drifted) / count(*) AS drift_rate,
       wilson_low(count(*) FILTER (drifted), count(*)) AS ci_low,
       wilson_high(count(*) FILTER (drifted), count(*)) AS ci_high,
       {per_kind}
FROM calls WHERE {MATCHED}
GROUP BY run_id, tool_name;"""


def _customer_drift(version: int) -> str:
    run_rates = "compounded_session_drift" if version < NAMES_SPLIT else "compounded_session_drift_run_rates"
    deprecated = "" if version < NAMES_SPLIT else (
        f",\n       s.{run_rates} AS compounded_session_drift  -- deprecated alias, kept for one release")
    return f"""
CREATE OR REPLACE VIEW customer_drift AS
WITH c AS (
    SELECT run_id, coalesce(customer, '(none)') AS customer, count(*) AS calls,
           count(*) FILTER (drifted) AS drifted_calls
    FROM calls WHERE {MATCHED} GROUP BY ALL),
s AS (
    SELECT run_id, coalesce(customer, '(none)') AS customer, count(*) AS sessions,
           count(*) FILTER (any_drift) AS sessions_with_drift,
           avg(compounded_p ORDER BY session_id) AS {run_rates}
    FROM sessions WHERE matched_calls > 0 GROUP BY ALL)
SELECT c.run_id, c.customer, c.calls, c.drifted_calls, c.drifted_calls / c.calls AS drift_rate,
       wilson_low(c.drifted_calls, c.calls) AS ci_low, wilson_high(c.drifted_calls, c.calls) AS ci_high,
       s.sessions, s.sessions_with_drift, s.sessions_with_drift / s.sessions AS observed_session_drift,
       s.{run_rates}{deprecated}
FROM c LEFT JOIN s USING (run_id, customer);"""


def _argument_drift() -> str:
    return f"""
CREATE OR REPLACE VIEW argument_drift AS
WITH per_tool AS (
    SELECT run_id, tool_name, count(*) AS tool_calls FROM calls WHERE {MATCHED} GROUP BY ALL)
SELECT d.run_id, d.tool_name, d.arg_path, count(*) AS diffs,
       count(DISTINCT (d.session_id, d.call_index)) AS calls_with_diff, p.tool_calls,
       count(DISTINCT (d.session_id, d.call_index)) / p.tool_calls AS rate,
       string_agg(DISTINCT d.diff_kind, ',' ORDER BY d.diff_kind) AS diff_kinds,
       arg_min(d.baseline_value, (d.session_id, d.call_index, d.call_position)) AS example_baseline,
       arg_min(d.candidate_value, (d.session_id, d.call_index, d.call_position)) AS example_candidate
FROM arg_diffs d LEFT JOIN per_tool p ON p.run_id = d.run_id AND p.tool_name IS NOT DISTINCT FROM d.tool_name
GROUP BY d.run_id, d.tool_name, d.arg_path, p.tool_calls;"""


def _path_performance(version: int) -> str:
    chunks = "replay_batches" if version < NAMES_SPLIT else "replay_chunks"
    return f"""
CREATE OR REPLACE VIEW path_performance AS
SELECT run_id, side, any_value(path_name) AS path_name, sum(calls) AS calls, sum(wall_s) AS wall_s,{
       " sum(reused_prefill_s) AS reused_prefill_s," if version >= PREFILL_CHARGED else ""}
       sum(completion_tokens) AS completion_tokens,
       sum(completion_tokens) / nullif(sum(wall_s), 0) AS tokens_per_s,
       sum(drafted_tokens) AS drafted_tokens, sum(accepted_tokens) AS accepted_tokens,
       sum(accepted_tokens) / nullif(sum(drafted_tokens), 0) AS acceptance_rate,
       sum(completion_tokens) / nullif(sum(forward_passes), 0) AS tokens_per_forward_pass,
       sum(errors) AS errors
FROM {chunks} GROUP BY run_id, side;"""


def replay_batches_alias() -> str:
    """The table's old name, kept as a view for users' SQL for one release: a replay chunk was
    called a batch, a word now kept for the OpenAI Batch interop."""
    return """
CREATE VIEW replay_batches AS
SELECT run_id, chunk_no AS batch_no, side, path_name, calls, wall_s, completion_tokens, drafted_tokens,
       accepted_tokens, forward_passes, errors
FROM replay_chunks;"""


def _frontier(per_customer: bool, version: int = LATEST) -> str:
    """The remedy frontier: each candidate run of a matrix (a run outside a matrix is a matrix of one) with its
    drift, the session drift its per-call rate implies at the observed session length, its speed against the
    shared baseline, and whether it is Pareto-optimal (no other candidate, nor the baseline itself at 0 drift
    and 1.0x, is at least as good on both drift and speed and better on one). Since migration 14 a matrix's
    noise-floor member is named (`noise_floor`) and is no candidate: its `pareto` is NULL and it beats no one (it
    is the baseline decoded again, often faster at its larger batch). Speeds come from the matched
    calls' outputs (tokens over each call's share of its engine call's wall time), so a customer's row uses only
    that customer's calls; recorded logs have no timings, so their speed and `pareto` are NULL."""
    name = "customer_frontier" if per_customer else "frontier"
    cust = "coalesce(customer, '(none)') AS customer, " if per_customer else ""
    ccust = "coalesce(c.customer, '(none)') AS customer, " if per_customer else ""
    using = "run_id, customer" if per_customer else "run_id"
    same = " AND o.customer = b.customer" if per_customer else ""

    def speed(side: str) -> str:
        return (f"sum(o.completion_tokens) FILTER (o.side = '{side}' AND o.tokens_per_s > 0) / nullif(sum("
                f"o.completion_tokens / o.tokens_per_s) FILTER (o.side = '{side}' AND o.tokens_per_s > 0), 0)")
    # Before migration 13 speed counted matched calls only (so the frontier's tokens/s and acceptance differed
    # from `summary`'s); since, one definition (`analysis.speed`): every call the path decoded, its tokens over
    # its share of the chunk's wall time.
    decoded = f"c.{MATCHED}" if version < SPEED_UNIFIED else "true"
    apart = version >= FLOOR_APART
    floor_col = f", {IS_FLOOR} AS noise_floor" if apart else ""
    not_floor = " AND NOT o.noise_floor" if apart else ""
    floor_null = "b.noise_floor OR " if apart else ""
    if version >= EVERY_SAMPLE:
        by_speed = _speed_every_sample(ccust)
    else:
        by_speed = f"""by_speed AS (
    SELECT o.run_id, {ccust}{speed("baseline")} AS baseline_tokens_per_s,
           {speed("candidate")} AS candidate_tokens_per_s,
           sum(o.accepted_tokens) FILTER (o.side = 'candidate')
               / nullif(sum(o.drafted_tokens) FILTER (o.side = 'candidate'), 0) AS acceptance_rate,
           sum(o.completion_tokens) FILTER (o.side = 'candidate')
               / nullif(sum(o.forward_passes) FILTER (o.side = 'candidate'), 0) AS tokens_per_forward_pass
    FROM outputs o JOIN calls c USING (run_id, session_id, call_index)
    WHERE {decoded} GROUP BY ALL)"""
    return f"""
CREATE OR REPLACE VIEW {name} AS
WITH members AS (
    SELECT run_id, coalesce(matrix_id, run_id) AS matrix_id, baseline_name AS baseline,
           candidate_name AS candidate{floor_col}
    FROM runs WHERE kind <> 'matrix'),
by_calls AS (
    SELECT run_id, {cust}count(*) AS calls, count(*) FILTER (drifted) AS drifted_calls
    FROM calls WHERE {MATCHED} GROUP BY ALL),
by_sessions AS (
    SELECT run_id, {cust}count(*) AS sessions, sum(matched_calls) AS session_calls,
           count(*) FILTER (any_drift) AS sessions_with_drift
    FROM sessions WHERE matched_calls > 0 GROUP BY ALL),
{by_speed},
rated AS (
    SELECT m.matrix_id, m.run_id, m.baseline, m.candidate, {"c.customer, " if per_customer else ""}c.calls,
           c.drifted_calls, c.drifted_calls / c.calls AS drift_rate,
           wilson_low(c.drifted_calls, c.calls) AS ci_low, wilson_high(c.drifted_calls, c.calls) AS ci_high,
           s.sessions, s.session_calls / s.sessions AS mean_calls_per_session,
           s.sessions_with_drift / s.sessions AS observed_session_drift,
           p.baseline_tokens_per_s, p.candidate_tokens_per_s,
           p.candidate_tokens_per_s / nullif(p.baseline_tokens_per_s, 0) AS speedup,
           p.acceptance_rate, p.tokens_per_forward_pass{", m.noise_floor" if apart else ""}
    FROM members m JOIN by_calls c USING (run_id) LEFT JOIN by_sessions s USING ({using})
    LEFT JOIN by_speed p USING ({using}))
SELECT b.matrix_id, b.run_id, b.baseline, b.candidate, {"b.customer, " if per_customer else ""}b.calls,
       b.drifted_calls, b.drift_rate, b.ci_low, b.ci_high, b.sessions, b.mean_calls_per_session,
       b.observed_session_drift,
       1 - (1 - b.drift_rate) ^ b.mean_calls_per_session AS session_drift,
       1 - (1 - b.ci_high) ^ b.mean_calls_per_session AS session_drift_high,
       b.baseline_tokens_per_s, b.candidate_tokens_per_s, b.speedup, b.acceptance_rate, b.tokens_per_forward_pass,
       CASE WHEN {floor_null}b.speedup IS NULL THEN NULL
            ELSE NOT (b.speedup <= 1 AND (b.drift_rate > 0 OR b.speedup < 1)) AND NOT EXISTS (
                SELECT 1 FROM rated o WHERE o.matrix_id = b.matrix_id{same} AND o.run_id <> b.run_id{not_floor}
                  AND o.speedup IS NOT NULL AND o.drift_rate <= b.drift_rate AND o.speedup >= b.speedup
                  AND (o.drift_rate < b.drift_rate OR o.speedup > b.speedup)) END AS pareto{
                  ", b.noise_floor" if apart else ""}
FROM rated b;"""


VIEW_BUILDERS = {"call_drift": lambda v: _call_drift(), "session_drift": lambda v: _session_drift(),
                 "tool_drift": lambda v: _tool_drift(), "customer_drift": _customer_drift,
                 "argument_drift": lambda v: _argument_drift(), "path_performance": _path_performance,
                 "frontier": lambda v: _frontier(False, v), "customer_frontier": lambda v: _frontier(True, v)}
# The views before migration 7 (runs.matrix_id): migrations 4 and 6 create exactly these, so a fresh file
# migrates in order (the frontier views need the column that migration 7 adds).
CORE_VIEWS = ("call_drift", "session_drift", "tool_drift", "customer_drift", "argument_drift", "path_performance")


def _speed_every_sample(ccust: str) -> str:
    """Speed since migration 16: each decoded call's tokens over its share of its engine call's wall time
    (`outputs.wall_share_s`; before it, implied by completion_tokens / tokens_per_s), where a sampled call's
    tokens and speculative counters are every sample's (`samples`), not sample 0's: a sampled run's figures equal
    `path_performance`'s. Older rows: a NULL share falls back to the implied one, NULL sample counters to sample
    0's (as those runs read before)."""
    def tps(side: str) -> str:
        return (f"sum(tokens) FILTER (side = '{side}' AND share > 0) "
                f"/ nullif(sum(share) FILTER (side = '{side}' AND share > 0), 0)")
    cand = "FILTER (side = 'candidate')"
    return f"""per_sample AS (
    SELECT run_id, session_id, call_index, side, sum(completion_tokens) AS tokens, sum(drafted_tokens) AS drafted,
           sum(accepted_tokens) AS accepted, sum(forward_passes) AS passes
    FROM samples GROUP BY ALL),
per_call AS (
    SELECT o.run_id, {ccust}o.side, coalesce(s.tokens, o.completion_tokens) AS tokens,
           coalesce(o.wall_share_s, o.completion_tokens / nullif(o.tokens_per_s, 0)) AS share,
           coalesce(s.drafted, o.drafted_tokens) AS drafted, coalesce(s.accepted, o.accepted_tokens) AS accepted,
           coalesce(s.passes, o.forward_passes) AS passes,
           CASE WHEN s.passes IS NULL THEN o.completion_tokens ELSE s.tokens END AS pass_tokens
    FROM outputs o JOIN calls c USING (run_id, session_id, call_index)
    LEFT JOIN per_sample s USING (run_id, session_id, call_index, side)),
by_speed AS (
    SELECT run_id, {"customer, " if ccust else ""}{tps("baseline")} AS baseline_tokens_per_s,
           {tps("candidate")} AS candidate_tokens_per_s,
           sum(accepted) {cand} / nullif(sum(drafted) {cand}, 0) AS acceptance_rate,
           sum(pass_tokens) {cand} / nullif(sum(passes) {cand}, 0) AS tokens_per_forward_pass
    FROM per_call GROUP BY ALL)"""


def views_sql(names: tuple[str, ...] | None = None, version: int = LATEST) -> str:
    """CREATE OR REPLACE statements for the named reporting views (default: all of them), as migration `version`
    creates them."""
    return "\n".join(VIEW_BUILDERS[n](version) for n in (names or tuple(VIEW_BUILDERS)))
