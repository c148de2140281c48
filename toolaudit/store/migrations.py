"""Append-only numbered schema migrations. Never edit a released migration: add the next number.

Every column is documented in docs/schema.md; a test checks the exact columns of a freshly migrated file.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from toolaudit.store.views import CORE_VIEWS, replay_batches_alias, views_sql

# The table every migration records itself in: made before the first migration (by `Store.migrate`, and for the
# template by `template.new_schema_file`).
SCHEMA_MIGRATIONS_TABLE = ("CREATE TABLE IF NOT EXISTS schema_migrations ("
                           "version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, applied_at TIMESTAMP NOT NULL)")
_MATRIX_COLUMN = "ALTER TABLE runs ADD COLUMN matrix_id BIGINT;\n"
_PREFILL_COLUMN = "ALTER TABLE replay_chunks ADD COLUMN reused_prefill_s DOUBLE;\n"
# A call's share of its engine call's wall time, stored (it was only implied, by completion_tokens / tokens_per_s,
# which a call without a token lost), and each sample's speculative counters: a sampled run's speed and acceptance
# count every sample, as `path_performance` does.
_SPEED_COLUMNS = """
ALTER TABLE outputs ADD COLUMN wall_share_s DOUBLE;
ALTER TABLE samples ADD COLUMN drafted_tokens INTEGER;
ALTER TABLE samples ADD COLUMN accepted_tokens INTEGER;
ALTER TABLE samples ADD COLUMN forward_passes INTEGER;
"""
_CHUNKS_RENAMED = """
ALTER TABLE replay_batches RENAME TO replay_chunks;
ALTER TABLE replay_chunks RENAME COLUMN batch_no TO chunk_no;
"""

MIGRATIONS: list[tuple[int, str, str]] = [
    (1, "core tables and drift views", """
CREATE SEQUENCE run_id_seq START 1;

CREATE TABLE runs (
    run_id BIGINT PRIMARY KEY,
    name VARCHAR,
    kind VARCHAR NOT NULL,               -- compare | replay
    status VARCHAR NOT NULL,             -- running | complete | interrupted | failed
    created_at TIMESTAMP NOT NULL,
    finished_at TIMESTAMP,
    baseline_name VARCHAR,
    candidate_name VARCHAR,
    baseline_source VARCHAR,
    candidate_source VARCHAR,
    baseline_fingerprint VARCHAR,
    candidate_fingerprint VARCHAR,
    options JSON,
    counts JSON,
    toolaudit_version VARCHAR
);

CREATE TABLE calls (
    run_id BIGINT NOT NULL,
    session_id VARCHAR NOT NULL,
    call_index INTEGER NOT NULL,
    customer VARCHAR,
    tool_name VARCHAR,
    match_status VARCHAR NOT NULL,       -- matched | baseline_only | candidate_only
    drift_kind VARCHAR,
    drifted BOOLEAN,
    exact_text_match BOOLEAN,
    baseline_valid BOOLEAN,
    candidate_valid BOOLEAN,
    arg_diff_count INTEGER,
    detail VARCHAR,
    PRIMARY KEY (run_id, session_id, call_index)
);

CREATE TABLE outputs (
    run_id BIGINT NOT NULL,
    session_id VARCHAR NOT NULL,
    call_index INTEGER NOT NULL,
    side VARCHAR NOT NULL,               -- baseline | candidate
    path_name VARCHAR,
    source VARCHAR,
    line INTEGER,
    text VARCHAR,
    tool_calls JSON,
    parse_status VARCHAR,
    parse_format VARCHAR,
    parse_error VARCHAR,
    schema_errors JSON,
    system_fingerprint VARCHAR,
    PRIMARY KEY (run_id, session_id, call_index, side)
);

CREATE TABLE arg_diffs (
    run_id BIGINT NOT NULL,
    session_id VARCHAR NOT NULL,
    call_index INTEGER NOT NULL,
    call_position INTEGER NOT NULL,
    tool_name VARCHAR,
    arg_path VARCHAR NOT NULL,
    diff_kind VARCHAR NOT NULL,
    baseline_value JSON,
    candidate_value JSON
);

CREATE TABLE sessions (
    run_id BIGINT NOT NULL,
    session_id VARCHAR NOT NULL,
    customer VARCHAR,
    calls INTEGER NOT NULL,
    matched_calls INTEGER NOT NULL,
    drifted_calls INTEGER NOT NULL,
    any_drift BOOLEAN,
    compounded_p DOUBLE,
    PRIMARY KEY (run_id, session_id)
);

CREATE TABLE trace_errors (
    run_id BIGINT NOT NULL,
    side VARCHAR NOT NULL,
    source VARCHAR NOT NULL,
    line INTEGER,
    field VARCHAR,
    message VARCHAR NOT NULL,
    excerpt VARCHAR
);

CREATE TABLE schema_issues (
    run_id BIGINT NOT NULL,
    tool_name VARCHAR NOT NULL,
    schema_source VARCHAR,
    severity VARCHAR NOT NULL,           -- warning | invalid
    message VARCHAR NOT NULL
);

CREATE MACRO wilson_low(k, n) AS CASE WHEN n = 0 OR k = 0 THEN 0.0 ELSE greatest(0.0,
    ((k / n) + 1.959963984540054 ^ 2 / (2 * n)
     - 1.959963984540054 * sqrt((k / n) * (1 - k / n) / n + 1.959963984540054 ^ 2 / (4 * n * n)))
    / (1 + 1.959963984540054 ^ 2 / n)) END;
CREATE MACRO wilson_high(k, n) AS CASE WHEN n = 0 OR k = n THEN 1.0 ELSE least(1.0,
    ((k / n) + 1.959963984540054 ^ 2 / (2 * n)
     + 1.959963984540054 * sqrt((k / n) * (1 - k / n) / n + 1.959963984540054 ^ 2 / (4 * n * n)))
    / (1 + 1.959963984540054 ^ 2 / n)) END;

CREATE VIEW call_drift AS
SELECT c.run_id, r.name AS run_name, c.session_id, c.call_index, coalesce(c.customer, '(none)') AS customer,
       c.tool_name, c.drift_kind, c.drifted, c.exact_text_match, c.baseline_valid, c.candidate_valid,
       c.arg_diff_count, c.detail
FROM calls c JOIN runs r USING (run_id)
WHERE c.match_status = 'matched';

CREATE VIEW session_drift AS
SELECT s.run_id, r.name AS run_name, s.session_id, coalesce(s.customer, '(none)') AS customer, s.calls,
       s.matched_calls, s.drifted_calls, s.any_drift, s.compounded_p
FROM sessions s JOIN runs r USING (run_id);

CREATE VIEW tool_drift AS
SELECT run_id, tool_name, count(*) AS calls, count(*) FILTER (drifted) AS drifted_calls,
       count(*) FILTER (drifted) / count(*) AS drift_rate,
       wilson_low(count(*) FILTER (drifted), count(*)) AS ci_low,
       wilson_high(count(*) FILTER (drifted), count(*)) AS ci_high,
       count(*) FILTER (drift_kind = 'arguments_changed') AS arguments_changed,
       count(*) FILTER (drift_kind = 'schema_broken') AS schema_broken,
       count(*) FILTER (drift_kind = 'tool_name_changed') AS tool_name_changed,
       count(*) FILTER (drift_kind = 'call_count_changed') AS call_count_changed,
       count(*) FILTER (drift_kind = 'unparseable') AS unparseable
FROM calls WHERE match_status = 'matched'
GROUP BY run_id, tool_name;

CREATE VIEW customer_drift AS
WITH c AS (
    SELECT run_id, coalesce(customer, '(none)') AS customer, count(*) AS calls,
           count(*) FILTER (drifted) AS drifted_calls
    FROM calls WHERE match_status = 'matched' GROUP BY ALL),
s AS (
    SELECT run_id, coalesce(customer, '(none)') AS customer, count(*) AS sessions,
           count(*) FILTER (any_drift) AS sessions_with_drift, avg(compounded_p) AS compounded_session_drift
    FROM sessions WHERE matched_calls > 0 GROUP BY ALL)
SELECT c.run_id, c.customer, c.calls, c.drifted_calls, c.drifted_calls / c.calls AS drift_rate,
       wilson_low(c.drifted_calls, c.calls) AS ci_low, wilson_high(c.drifted_calls, c.calls) AS ci_high,
       s.sessions, s.sessions_with_drift, s.sessions_with_drift / s.sessions AS observed_session_drift,
       s.compounded_session_drift
FROM c LEFT JOIN s USING (run_id, customer);

CREATE VIEW argument_drift AS
WITH per_tool AS (
    SELECT run_id, tool_name, count(*) AS tool_calls FROM calls WHERE match_status = 'matched' GROUP BY ALL)
SELECT d.run_id, d.tool_name, d.arg_path, count(*) AS diffs,
       count(DISTINCT (d.session_id, d.call_index)) AS calls_with_diff, p.tool_calls,
       count(DISTINCT (d.session_id, d.call_index)) / p.tool_calls AS rate,
       string_agg(DISTINCT d.diff_kind, ',' ORDER BY d.diff_kind) AS diff_kinds,
       any_value(d.baseline_value) AS example_baseline, any_value(d.candidate_value) AS example_candidate
FROM arg_diffs d LEFT JOIN per_tool p ON p.run_id = d.run_id AND p.tool_name IS NOT DISTINCT FROM d.tool_name
GROUP BY d.run_id, d.tool_name, d.arg_path, p.tool_calls;
"""),
    (2, "decode evidence for replays", """
ALTER TABLE outputs ADD COLUMN token_ids INTEGER[];
ALTER TABLE outputs ADD COLUMN prompt_tokens INTEGER;
ALTER TABLE outputs ADD COLUMN completion_tokens INTEGER;
ALTER TABLE outputs ADD COLUMN latency_s DOUBLE;
ALTER TABLE outputs ADD COLUMN ttft_s DOUBLE;
ALTER TABLE outputs ADD COLUMN tokens_per_s DOUBLE;
ALTER TABLE outputs ADD COLUMN drafted_tokens INTEGER;
ALTER TABLE outputs ADD COLUMN accepted_tokens INTEGER;
ALTER TABLE outputs ADD COLUMN forward_passes INTEGER;
ALTER TABLE outputs ADD COLUMN error VARCHAR;
ALTER TABLE calls ADD COLUMN first_divergence INTEGER;
ALTER TABLE calls ADD COLUMN baseline_token VARCHAR;
ALTER TABLE calls ADD COLUMN candidate_token VARCHAR;
ALTER TABLE calls ADD COLUMN baseline_margin DOUBLE;
ALTER TABLE calls ADD COLUMN candidate_margin DOUBLE;
"""),
    (3, "per-batch replay timings", """
CREATE TABLE replay_batches (
    run_id BIGINT NOT NULL,
    batch_no INTEGER NOT NULL,
    side VARCHAR NOT NULL,
    path_name VARCHAR,
    calls INTEGER NOT NULL,
    wall_s DOUBLE NOT NULL,
    completion_tokens BIGINT,
    drafted_tokens BIGINT,
    accepted_tokens BIGINT,
    forward_passes BIGINT,
    errors INTEGER
);

CREATE VIEW path_performance AS
SELECT run_id, side, any_value(path_name) AS path_name, sum(calls) AS calls, sum(wall_s) AS wall_s,
       sum(completion_tokens) AS completion_tokens,
       sum(completion_tokens) / nullif(sum(wall_s), 0) AS tokens_per_s,
       sum(drafted_tokens) AS drafted_tokens, sum(accepted_tokens) AS accepted_tokens,
       sum(accepted_tokens) / nullif(sum(drafted_tokens), 0) AS acceptance_rate,
       sum(completion_tokens) / nullif(sum(forward_passes), 0) AS tokens_per_forward_pass,
       sum(errors) AS errors
FROM replay_batches GROUP BY run_id, side;
"""),
    (4, "views generated from the drift vocabulary", views_sql(CORE_VIEWS, version=4)),
    (5, "staged results for path-major replays", """
CREATE TABLE staged_results (
    run_id BIGINT NOT NULL,
    session_id VARCHAR NOT NULL,
    call_index INTEGER NOT NULL,
    side VARCHAR NOT NULL,
    path_name VARCHAR,
    wall_share_s DOUBLE,
    result JSON NOT NULL,
    PRIMARY KEY (run_id, session_id, call_index, side)
);
"""),
    (6, "views with order-independent aggregates (exact merges of shards)", views_sql(CORE_VIEWS, version=6)),
    (7, "remedy matrices: candidate runs grouped under a matrix run, and the frontier views",
     _MATRIX_COLUMN + views_sql(version=7)),
    # "batch" keeps one meaning (the OpenAI Batch interop): a replay's engine calls are chunks. The old table
    # name stays readable as a view for one release; so does customer_drift's old column.
    (8, "names: replay_batches -> replay_chunks, the two compounded session figures named apart",
     _CHUNKS_RENAMED + views_sql(("path_performance", "customer_drift"), version=8) + replay_batches_alias()),
    # Only the candidate's doing counts as drift: a pair is compared when both sides answer the same request
    # (request_digest) and neither was cut at max_tokens (finish_reason `length`); match statuses `mismatched`
    # and `truncated` need no schema change (match_status is VARCHAR). Rows written before hold NULL: unknown.
    (9, "finish reasons and request digests of outputs", """
ALTER TABLE outputs ADD COLUMN finish_reason VARCHAR;
ALTER TABLE outputs ADD COLUMN request_digest VARCHAR;
"""),
    # Sampled replays (temperature > 0, `samples` per call): every sample's outcome, and per call the two-sample
    # test of the baseline's and candidate's outcome distributions. The call's `calls` and `outputs` rows are
    # those of sample 0, as in a replay with one sample (and, at temperature > 0, labelled sampling noise).
    (10, "samples of sampled replays and their per-call distribution tests", """
CREATE TABLE samples (
    run_id BIGINT NOT NULL,
    session_id VARCHAR NOT NULL,
    call_index INTEGER NOT NULL,
    side VARCHAR NOT NULL,
    sample_index INTEGER NOT NULL,
    path_name VARCHAR,
    outcome VARCHAR NOT NULL,
    outcome_kind VARCHAR NOT NULL,
    tool_name VARCHAR,
    arguments JSON,
    text VARCHAR,
    completion_tokens INTEGER,
    finish_reason VARCHAR,
    error VARCHAR,
    PRIMARY KEY (run_id, session_id, call_index, side, sample_index)
);

CREATE TABLE sampled_calls (
    run_id BIGINT NOT NULL,
    session_id VARCHAR NOT NULL,
    call_index INTEGER NOT NULL,
    customer VARCHAR,
    tool_name VARCHAR,
    n_baseline INTEGER NOT NULL,
    n_candidate INTEGER NOT NULL,
    outcomes INTEGER NOT NULL,
    statistic DOUBLE,
    p_value DOUBLE,
    tv DOUBLE,
    tv_low DOUBLE,
    tv_high DOUBLE,
    PRIMARY KEY (run_id, session_id, call_index)
);

CREATE VIEW sampled_call_shifts AS
SELECT *, q_value <= 0.05 AS shifted FROM (
    SELECT *, least(1.0, min(p_value * m / rank) OVER (
        PARTITION BY run_id ORDER BY p_value DESC, rank DESC ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW))
        AS q_value
    FROM (SELECT *, count(p_value) OVER (PARTITION BY run_id) AS m,
                 row_number() OVER (PARTITION BY run_id ORDER BY p_value, session_id, call_index) AS rank
          FROM sampled_calls WHERE p_value IS NOT NULL)
);
"""),
    # Behavioural fingerprints: a fixed probe set decoded greedily, the chosen tokens and the logprobs hashed
    # (`toolaudit fingerprint --probe`, and each replay's paths at the start of the run).
    (11, "probe fingerprints of decode paths", """
CREATE SEQUENCE probe_id_seq START 1;

CREATE TABLE probes (
    probe_id BIGINT PRIMARY KEY,
    created_at TIMESTAMP NOT NULL,
    run_id BIGINT,
    side VARCHAR,
    path_name VARCHAR NOT NULL,
    engine VARCHAR NOT NULL,
    config_fingerprint VARCHAR NOT NULL,
    probe_set VARCHAR NOT NULL,
    prompts INTEGER NOT NULL,
    repeats INTEGER NOT NULL,
    decisions VARCHAR NOT NULL,
    numerics VARCHAR,
    stable BOOLEAN NOT NULL,
    jitter_max DOUBLE,
    jitter_median DOUBLE,
    seconds DOUBLE,
    toolaudit_version VARCHAR,
    engine_versions JSON,
    detail JSON
);
"""),
    # The tool of the recorded call (the first tool call of the trace's recorded response; for two recorded logs,
    # the baseline log's): per-tool figures are keyed by it, never by a name a decode path invented. NULL where the
    # recorded response called no tool or none was recorded, and in the rows written before this migration (their
    # figures fall back to `tool_name`: `queries.tool_key_sql`).
    (12, "the recorded call's tool of each call", """
ALTER TABLE calls ADD COLUMN recorded_tool VARCHAR;
"""),
    (13, "one speed definition: the frontier views' tokens/s and acceptance over every decoded call",
     views_sql(("frontier", "customer_frontier"), version=13)),
    (14, "the frontier views name the noise floor and leave it out of pareto (a reference, never a candidate)",
     views_sql(("frontier", "customer_frontier"), version=14)),
    # Paths on one model share prompt KV: the prefill a path reused from another path's run is charged to it, as
    # part of wall_s (`engines.charged_seconds`), and named here. NULL in the rows written before.
    (15, "each path charged its own prompts' prefill: replay_chunks.reused_prefill_s",
     _PREFILL_COLUMN + views_sql(("path_performance",), version=15)),
    (16, "a sampled run's speed and acceptance over every sample: outputs.wall_share_s, samples' counters",
     _SPEED_COLUMNS + views_sql(("frontier", "customer_frontier"), version=16)),
]

# A new file runs the migrations in one transaction with each reporting view created once, at its latest
# definition, after every table (`views_sql()`): the migrations that only re-create views contribute their
# tables, if any. The same schema as migrating step by step (tests/store/test_migrations.py compares them), in
# about half the time (a new file took ~115 ms, two thirds of it re-creating views 6 times; the suite makes
# thousands), and a file that is either fully created or not at all.
TABLES_ONLY = {4: "", 6: "", 7: _MATRIX_COLUMN, 8: _CHUNKS_RENAMED + replay_batches_alias(), 13: "", 14: "",
               15: _PREFILL_COLUMN, 16: _SPEED_COLUMNS}


def create_schema(con: Any, applied_at: dt.datetime) -> None:
    """A new file's schema (inside the caller's transaction): every migration's tables, then each view once at
    its latest definition (`TABLES_ONLY`), every version recorded as applied at `applied_at`."""
    for version, name, sql in MIGRATIONS:
        ddl = TABLES_ONLY.get(version, sql)
        if ddl.strip():
            con.execute(ddl)
        con.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)", [version, name, applied_at])
    con.execute(views_sql())

