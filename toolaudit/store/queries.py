"""Named read queries: the SQL behind the run figures, the gate and the `runs` listing, in one place.

Each takes a `Store` and returns plain rows; the statistics (intervals, bounds) are computed by the callers.
A `customer` argument narrows a query to that customer's calls (`(none)` for calls without one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toolaudit import RunNotFound
from toolaudit.store.db import Store
from toolaudit.store.vocabulary import NOT_OFFERED, SEVERITY, MatchStatus

NONE_CUSTOMER = "(none)"
_MATCHED = f"match_status = '{MatchStatus.MATCHED.value}'"


def _slice(customer: str | None) -> tuple[str, list]:
    return ("", []) if customer is None else (" AND coalesce(customer, '(none)') = ?", [customer])


def list_runs(store: Store) -> tuple[list[str], list[tuple]]:
    """Every run with its matched and drifted calls; a matrix run holds no calls of its own (its candidates' runs
    do), so its counts are NULL rather than a misleading 0."""
    return store.query(f"""
        SELECT r.run_id, r.name, r.kind, r.status, r.matrix_id, r.created_at, r.baseline_name, r.candidate_name,
               CASE WHEN any_value(r.kind) <> 'matrix' THEN count(c.run_id) FILTER (c.{_MATCHED}) END AS calls,
               CASE WHEN any_value(r.kind) <> 'matrix' THEN count(c.run_id) FILTER (c.drifted) END AS drifted_calls
        FROM runs r LEFT JOIN calls c USING (run_id)
        GROUP BY ALL ORDER BY r.run_id""")


@dataclass(frozen=True)
class RunMatch:
    """The run a `--run ID|NAME` value names, and the other runs that share its name (newest first)."""

    run: dict
    named: bool  # found by its name rather than its id
    others: list[int]


def find_run(store: Store, ref: int | str, before: int | None = None) -> RunMatch:
    """The run an id or a name names. Digits are an id first, else a name; a name shared by several runs names the
    newest (with `before`, the newest older than that run: `check --against NAME`). Raises RunNotFound."""
    text = str(ref).strip()
    if text.isdigit():
        rows = store.rows("SELECT * FROM runs WHERE run_id = ?", [int(text)])
        if rows:
            return RunMatch(rows[0], False, [])
    older = "" if before is None else " AND run_id < ?"
    rows = store.rows(f"SELECT * FROM runs WHERE name = ?{older} ORDER BY run_id DESC",
                      [text] + ([] if before is None else [before]))
    if rows:
        return RunMatch(rows[0], True, [r["run_id"] for r in rows[1:]])
    known = store.query("SELECT name FROM runs GROUP BY name ORDER BY max(run_id) DESC LIMIT 6")[1]
    if not known:
        raise RunNotFound(f"{store.path}: no runs yet; run `toolaudit compare` or `replay` first")
    what = f"no run with id {text}" if text.isdigit() else f"no run named {text!r}"
    if before is not None:
        what += f" before run {before}"
    names = ", ".join(name for (name,) in known[:5]) + (", ..." if len(known) > 5 else "")
    raise RunNotFound(f"{store.path}: {what} (runs: {names}; see `toolaudit runs`)")


def slice_counts(store: Store, run_id: int, customer: str | None = None) -> dict[str, Any]:
    """Matched, drifted and exact calls, sessions, and both compounded session figures of a run or a customer.

    `compounded_run_rates`: mean over sessions of 1 - prod(1 - p_tool), p_tool the RUN-WIDE drift rate of each
    call's tool (the `sessions.compounded_p` column; `summary`'s `compounded_session_drift_run_rates`).
    `compounded_own_rates`: the same with the slice's OWN per-tool rates (a customer's report shows it as
    `compounded_session_drift_own_rates`: it must not depend on other customers' traffic). For a whole run the
    two are equal.
    """
    where, params = _slice(customer)
    row = store.rows(f"""
        WITH c AS (SELECT * FROM calls WHERE run_id = ? AND {_MATCHED}{where}),
        own AS (SELECT tool_name, avg(drifted::DOUBLE) AS p FROM c GROUP BY tool_name),
        s AS (SELECT c.session_id, count(*) AS n, bool_or(c.drifted) AS any_drift,
                     1 - product(1 - own.p ORDER BY c.call_index) AS own_p
              FROM c JOIN own ON own.tool_name IS NOT DISTINCT FROM c.tool_name GROUP BY c.session_id)
        SELECT (SELECT count(*) FROM c) AS calls,
               (SELECT count(*) FILTER (drifted) FROM c) AS drifted_calls,
               (SELECT count(*) FILTER (exact_text_match) FROM c) AS exact_text_matches,
               count(*) AS sessions, count(*) FILTER (any_drift) AS sessions_with_drift,
               avg(n) AS mean_calls_per_session, avg(own_p ORDER BY session_id) AS compounded_own_rates,
               (SELECT avg(compounded_p ORDER BY session_id) FROM sessions
                WHERE run_id = ? AND matched_calls > 0{where}) AS compounded_run_rates
        FROM s""", [run_id, *params, run_id, *params])[0]
    return row


def drift_kind_counts(store: Store, run_id: int, customer: str | None = None) -> dict[str, int]:
    where, params = _slice(customer)
    return dict(store.query(f"""SELECT drift_kind, count(*) FROM calls
        WHERE run_id = ? AND {_MATCHED}{where} GROUP BY 1 ORDER BY 2 DESC, 1""", [run_id, *params])[1])


def status_counts(store: Store, run_id: int, customer: str | None = None) -> dict[str, int]:
    """Calls per match status other than matched (one side only, engine errors)."""
    where, params = _slice(customer)
    return dict(store.query(f"""SELECT match_status, count(*) FROM calls
        WHERE run_id = ? AND NOT {_MATCHED}{where} GROUP BY 1""", [run_id, *params])[1])


def call_count(store: Store, run_id: int) -> int:
    """Every calls row of a run (any match status)."""
    return store.query("SELECT count(*) FROM calls WHERE run_id = ?", [run_id])[1][0][0]


def held_calls(store: Store, run_id: int) -> int:
    """Every calls row of a run and, for a matrix, of its candidates' runs: 0 until its first chunk is stored."""
    return store.query("SELECT count(*) FROM calls WHERE run_id = ? OR run_id IN (SELECT run_id FROM runs WHERE "
                       "matrix_id = ?)", [run_id, run_id])[1][0][0]


def run_count(store: Store) -> int:
    return store.query("SELECT count(*) FROM runs")[1][0][0]


def trace_error_count(store: Store, run_id: int) -> int:
    return store.query("SELECT count(*) FROM trace_errors WHERE run_id = ?", [run_id])[1][0][0]


def trace_errors_sql(run_id: int) -> str:
    """The query that lists all of a run's error rows (printed for the user to run with `toolaudit sql`)."""
    return (f"SELECT side, source, line, field, message FROM trace_errors WHERE run_id = {int(run_id)} "
            "ORDER BY side, source, line")


def first_trace_errors(store: Store, run_id: int, limit: int = 5) -> list[dict[str, Any]]:
    """The first error rows of a run, by side, file and line."""
    return store.rows(f"{trace_errors_sql(run_id)} LIMIT ?", [limit])


def schema_issues_sql(run_id: int) -> str:
    """The query that lists all of a run's schema issues (printed for the user to run with `toolaudit sql`)."""
    return (f"SELECT tool_name, schema_source, severity, message FROM schema_issues WHERE run_id = {int(run_id)} "
            "ORDER BY tool_name, severity")


def schema_problems(store: Store, run_id: int, limit: int = 3) -> tuple[int, list[dict[str, Any]]]:
    """(how many, the first) of a run's schema issues that left calls unjudged: an invalid schema, one that fails
    while applied (a `$ref` cycle), a pattern out of budget. Normalisation warnings (`dict` -> `object`) are
    not counted: the schema still judges."""
    where = "FROM schema_issues WHERE run_id = ? AND severity <> 'warning'"
    count = store.query(f"SELECT count(*) {where}", [run_id])[1][0][0]
    rows = store.rows(f"SELECT tool_name, schema_source, severity, message {where} "
                      "ORDER BY tool_name, severity, message LIMIT ?", [run_id, limit])
    return count, rows


def customer_rows(store: Store, run_id: int) -> list[dict[str, Any]]:
    """Per customer, from `customer_drift`; `compounded_session_drift` is the deprecated name of the run-rates
    figure, kept in `summary --json` for one release."""
    return store.rows("""SELECT customer, calls, drifted_calls, drift_rate, ci_low, ci_high, sessions,
        sessions_with_drift, observed_session_drift, compounded_session_drift_run_rates,
        compounded_session_drift_run_rates AS compounded_session_drift
        FROM customer_drift WHERE run_id = ? ORDER BY customer""", [run_id])


def customer_session_lengths(store: Store, run_id: int) -> list[dict[str, Any]]:
    """Per customer, matched calls per session over its sessions with a matched call (as `slice_counts`)."""
    return store.rows("""SELECT coalesce(customer, '(none)') AS customer,
        sum(matched_calls) / count(*) AS calls_per_session
        FROM sessions WHERE run_id = ? AND matched_calls > 0 GROUP BY ALL""", [run_id])


SPEED_COLUMNS = ("baseline_tokens_per_s", "candidate_tokens_per_s", "acceptance_rate", "tokens_per_forward_pass")


def speed_row(store: Store, run_id: int, customer: str | None = None) -> dict[str, Any] | None:
    """A run's (or one customer's) speed figures from the frontier views (`analysis.speed`), or None."""
    columns = ", ".join(SPEED_COLUMNS)
    if customer is None:
        rows = store.rows(f"SELECT {columns} FROM frontier WHERE run_id = ?", [run_id])
    else:
        rows = store.rows(f"SELECT {columns} FROM customer_frontier WHERE run_id = ? AND customer = ?",
                          [run_id, customer])
    return rows[0] if rows else None


def prefill_charged(store: Store, run_id: int) -> bool | None:
    """Whether every timed chunk of the run charged its path the prefill it reused (migration 15 on); None
    without timings."""
    return store.rows("SELECT bool_and(reused_prefill_s IS NOT NULL) AS charged FROM replay_chunks "
                      "WHERE run_id = ?", [run_id])[0]["charged"]


def path_rows(store: Store, run_id: int) -> list[dict[str, Any]]:
    return store.rows("""SELECT side, path_name, calls, wall_s, completion_tokens, tokens_per_s,
        drafted_tokens, accepted_tokens, acceptance_rate, tokens_per_forward_pass, errors
        FROM path_performance WHERE run_id = ? ORDER BY side""", [run_id])


def margin_evidence(store: Store, run_id: int) -> dict[str, Any]:
    return store.rows("""SELECT count(*) FILTER (first_divergence IS NOT NULL) AS with_evidence,
        median(baseline_margin) AS median_margin FROM calls WHERE run_id = ? AND drifted""", [run_id])[0]


def worst_example(store: Store, run_id: int) -> dict[str, Any] | None:
    """The most severe drifted call (see `records.SEVERITY`) with both outputs and its argument diffs.
    `tool_name` is run A's (the baseline's) tool; `tool_key` the one the per-tool tables put the call under
    (`tool_key_sql`: the recorded call's tool where the run has them; None: the recorded answer called none)."""
    order = " ".join(f"WHEN '{k.value}' THEN {i}" for i, k in enumerate(SEVERITY))
    ctes, key, params = tool_key_sql(run_id)
    rows = store.rows(f"""WITH {ctes} SELECT session_id, call_index, customer, tool_name, {key} AS tool_key,
        drift_kind, detail, first_divergence, baseline_token, candidate_token, baseline_margin, candidate_margin
        FROM calls WHERE run_id = ? AND drifted
        ORDER BY CASE drift_kind {order} ELSE 9 END, baseline_margin DESC NULLS LAST, session_id, call_index
        LIMIT 1""", [*params, run_id])
    if not rows:
        return None
    example = rows[0]
    key = [run_id, example["session_id"], example["call_index"]]
    outputs = {r["side"]: r["text"] for r in store.rows(
        "SELECT side, text FROM outputs WHERE run_id = ? AND session_id = ? AND call_index = ?", key)}
    example["baseline_text"], example["candidate_text"] = outputs.get("baseline"), outputs.get("candidate")
    example["arg_diffs"] = store.rows("""SELECT arg_path, diff_kind, baseline_value, candidate_value
        FROM arg_diffs WHERE run_id = ? AND session_id = ? AND call_index = ? ORDER BY arg_path""", key)
    return example


def other_runs_fingerprints(store: Store, exclude_run: int) -> list[dict[str, Any]]:
    """Every other run's fingerprints and options, newest first (to explain a changed fingerprint)."""
    return store.rows("""SELECT run_id, options, baseline_fingerprint, candidate_fingerprint FROM runs
                         WHERE run_id <> ? ORDER BY run_id DESC""", [exclude_run])


_FRONTIER_COLUMNS = """run_id, candidate, calls, drifted_calls, sessions, mean_calls_per_session,
    observed_session_drift, baseline_tokens_per_s, candidate_tokens_per_s, speedup, acceptance_rate,
    tokens_per_forward_pass, pareto"""


def frontier_rows(store: Store, matrix_id: int, customer: str | None = None) -> list[dict[str, Any]]:
    """The candidates of a matrix (a plain run: its one candidate) from the `frontier` view, or from
    `customer_frontier` for one customer, in the order the candidates were given."""
    if customer is None:
        return store.rows(f"SELECT {_FRONTIER_COLUMNS} FROM frontier WHERE matrix_id = ? ORDER BY run_id",
                          [matrix_id])
    return store.rows(f"""SELECT {_FRONTIER_COLUMNS} FROM customer_frontier WHERE matrix_id = ? AND customer = ?
                          ORDER BY run_id""", [matrix_id, customer])


def frontier_customers(store: Store, matrix_id: int) -> list[str]:
    return [r["customer"] for r in store.rows(
        "SELECT DISTINCT customer FROM customer_frontier WHERE matrix_id = ? ORDER BY customer", [matrix_id])]


_ERROR = f"match_status = '{MatchStatus.ERROR.value}'"


def error_call_count(store: Store, run_id: int) -> int:
    """Calls an engine failed (replays, Batch imports): stored as error rows, left out of the drift figures."""
    return store.query(f"SELECT count(*) FROM calls WHERE run_id = ? AND {_ERROR}", [run_id])[1][0][0]


def error_calls_sql(run_id: int) -> str:
    """The query that lists a run's failed calls with the reason (printed for `toolaudit sql`)."""
    return (f"SELECT session_id, call_index, customer, detail FROM calls WHERE run_id = {int(run_id)} "
            f"AND {_ERROR} ORDER BY session_id, call_index")


def input_overlap(store: Store, run_id: int, other_id: int) -> dict[str, int]:
    """How two runs' inputs overlap, by the (session, call index) keys of their calls (any match status):
    `shared`, `only_run` (in `run_id` only), `only_other`."""
    return store.rows("""
        WITH a AS (SELECT DISTINCT session_id, call_index FROM calls WHERE run_id = ?),
             b AS (SELECT DISTINCT session_id, call_index FROM calls WHERE run_id = ?)
        SELECT count(*) FILTER (a.session_id IS NOT NULL AND b.session_id IS NOT NULL) AS shared,
               count(*) FILTER (b.session_id IS NULL) AS only_run,
               count(*) FILTER (a.session_id IS NULL) AS only_other
        FROM a FULL OUTER JOIN b USING (session_id, call_index)""", [run_id, other_id])[0]



def paired_drift(store: Store, run_a: int, run_b: int, customer: str | None = None,
                 by_tool: bool = False, fold_unknown_tools: bool = False,
                 by_recorded_tool: bool = False) -> list[dict[str, Any]]:
    """Calls matched in both runs (same session and call index), split by which run drifted on them: the 2x2
    table a paired comparison of two drift rates needs (a candidate against its noise floor). One row, or one
    per tool (run A's tool name, most calls first) with `by_tool`; with `by_recorded_tool`, run A's calls keyed
    by the recorded call's tool as `tool_rows` keys them (`tool_key_sql`: `fold_unknown_tools` folds the rows it
    falls back on); else with `fold_unknown_tools`, the names no schema knows fold into one `(other)` row."""
    where, params = _slice(customer)
    if by_recorded_tool:
        ctes, key, key_params = tool_key_sql(run_a, fold_unknown_tools)
        ctes += ", "
    elif fold_unknown_tools:
        ctes, key, key_params = f"{_KNOWN_TOOLS}, ", known_tool_sql(), [run_a, run_a]
    else:
        ctes, key, key_params = "", "tool_name", []
    tool, group = ("a.tool_name, ", "GROUP BY a.tool_name ORDER BY calls DESC, a.tool_name") if by_tool else ("", "")
    rows = store.rows(f"""
        WITH {ctes}a AS (SELECT session_id, call_index, {key} AS tool_name, drifted FROM calls
                   WHERE run_id = ? AND {_MATCHED}{where}),
        b AS (SELECT session_id, call_index, drifted FROM calls WHERE run_id = ? AND {_MATCHED}{where})
        SELECT {tool}count(*) AS calls, count(*) FILTER (a.drifted AND b.drifted) AS both,
               count(*) FILTER (a.drifted AND NOT b.drifted) AS only_a,
               count(*) FILTER (b.drifted AND NOT a.drifted) AS only_b
        FROM a JOIN b USING (session_id, call_index) {group}""", [*key_params, run_a, *params, run_b, *params])
    return [{k: v if k == "tool_name" else int(v or 0) for k, v in row.items()} for row in rows]


OTHER_TOOLS = "(other)"
# The tool names a schema judged in a run: a call's name checked against a schema (the request's declared tool or a
# --schema-dir file; `baseline_valid` is NULL where none knew it), or a declared tool whose schema had an issue.
# A decoded answer's invented name (`2025_q4`, `sell_304.5`) is in neither: no schema judged it, or (rows written
# since 2026-11-29) its only verdict is that the request did not offer it.
_KNOWN_TOOLS = f"""known AS (SELECT c.tool_name FROM calls c LEFT JOIN outputs o ON o.run_id = c.run_id
                                AND o.session_id = c.session_id AND o.call_index = c.call_index
                                AND o.side = 'baseline'
                            WHERE c.run_id = ? AND c.baseline_valid IS NOT NULL AND c.tool_name IS NOT NULL
                              AND NOT coalesce(contains(o.schema_errors, '{{"tool":' || to_json(c.tool_name)
                                                        || ',"errors":["{NOT_OFFERED}'), false)
                            UNION SELECT tool_name FROM schema_issues WHERE run_id = ?)"""


def known_tool_sql(column: str = "tool_name") -> str:
    """`column` where a schema knows that name (or NULL: no tool call), else `(other)`; needs `_KNOWN_TOOLS`."""
    return (f"CASE WHEN {column} IS NULL OR {column} IN (SELECT tool_name FROM known) THEN {column} "
            f"ELSE '{OTHER_TOOLS}' END")


# The migration that added `calls.recorded_tool` (migrations.py): a run created since wrote it on every calls row.
RECORDED_TOOL_MIGRATION = 12
# Whether a run's calls are keyed by the recorded call's tool (some row holds one), and whether the run wrote the
# column on all of its rows (created since the migration: NULL then means the recorded response called no tool;
# a run created before and resumed since holds NULL in the rows written before).
_RECORDED = f"""recorded AS (
    SELECT coalesce(bool_or(recorded_tool IS NOT NULL), false) AS keyed,
           coalesce((SELECT created_at FROM runs WHERE run_id = ?)
                    >= (SELECT applied_at FROM schema_migrations WHERE version = {RECORDED_TOOL_MIGRATION}),
                    false) AS written
    FROM calls WHERE run_id = ?)"""


def tool_key_sql(run_id: int, fold_unknown_tools: bool = False) -> tuple[str, str, list]:
    """(CTEs to put after WITH, the per-row expression, their parameters) of the key a run's per-tool rows use:
    the recorded call's tool (`calls.recorded_tool`) where the run's calls hold it, a row's NULL there meaning
    that the recorded response called no tool; in the rows written before the column (a run created before
    migration 12: all of them, or those before its resume) and in a run whose calls hold none (no recorded
    response named a tool; a Batch import, which has none), today's key: `tool_name`, with `fold_unknown_tools`
    the names no schema knows as `(other)` (`known_tool_sql`)."""
    fallback = known_tool_sql() if fold_unknown_tools else "tool_name"
    ctes = (f"{_KNOWN_TOOLS}, " if fold_unknown_tools else "") + _RECORDED
    key = (f"CASE WHEN recorded_tool IS NOT NULL THEN recorded_tool "
           f"WHEN (SELECT keyed AND written FROM recorded) THEN NULL ELSE {fallback} END")
    return ctes, key, [*([run_id, run_id] if fold_unknown_tools else []), run_id, run_id]


def keyed_by_recorded_tool(store: Store, run_id: int) -> bool:
    """Whether any of a run's calls rows names the recorded call's tool (`tool_key_sql` keys by it then)."""
    return store.query("SELECT EXISTS (SELECT 1 FROM calls WHERE run_id = ? AND recorded_tool IS NOT NULL)",
                       [run_id])[1][0][0]


def tool_rows(store: Store, run_id: int, fold_unknown_tools: bool = False) -> list[dict[str, Any]]:
    """Matched and drifted calls per tool, most calls first, keyed by the recorded call's tool (`tool_key_sql`;
    where a run's rows predate it: the `calls.tool_name`, the baseline's first call's, with `fold_unknown_tools`
    the names no schema knows folded into one `(other)` row)."""
    ctes, key, params = tool_key_sql(run_id, fold_unknown_tools)
    rows = store.rows(f"""WITH {ctes} SELECT {key} AS tool_name, count(*) AS calls,
            count(*) FILTER (drifted) AS drifted_calls
        FROM calls WHERE run_id = ? AND {_MATCHED} GROUP BY 1 ORDER BY calls DESC, 1 NULLS LAST""",
                      [*params, run_id])
    return [{**row, "calls": int(row["calls"]), "drifted_calls": int(row["drifted_calls"])} for row in rows]


# the store's own bookkeeping: no figures in it for a user's query
_INTERNAL_TABLES = ("schema_migrations", "staged_results", "toolaudit_snapshot")


def catalog(store: Store) -> tuple[list[str], list[str]]:
    """(views, tables) a user's SQL can query, by name: `sql` lists them for an unknown table (DuckDB's own
    suggestion is the nearest name in its catalog, often one of its system views such as pg_description)."""
    rows = store.rows("SELECT table_name, table_type FROM information_schema.tables WHERE table_schema = "
                      "current_schema() ORDER BY table_name")
    names = [r for r in rows if r["table_name"] not in _INTERNAL_TABLES]
    return ([r["table_name"] for r in names if r["table_type"] == "VIEW"],
            [r["table_name"] for r in names if r["table_type"] != "VIEW"])


def run_rows(store: Store) -> list[dict[str, Any]]:
    """Every run row, oldest first (the Python API's `Database.runs`)."""
    return store.rows("SELECT * FROM runs ORDER BY run_id")


def calls_relation(store: Store, run_id: int):
    """A run's calls as a lazy DuckDB relation (`.df()`, `.arrow()`, `.filter()`...), in key order."""
    return store.con.sql("SELECT * FROM calls WHERE run_id = $run ORDER BY session_id, call_index",
                         params={"run": run_id})


def relation(store: Store, query: str):
    """A user's query (`toolaudit sql`, the Python API's `Database.sql`) as a lazy DuckDB relation."""
    return store.con.sql(query)
