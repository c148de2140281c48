"""The openai engine through a fault-injecting proxy (tests/faultproxy.py) in front of a real `toolaudit serve`
(the tiny float32 model): every fault kind a gateway or an overloaded server produces, on plain and streamed
requests, transient (the retry must recover) and persistent (the call must end as an error row naming why).

Promise checked: each call ends as the fault-free answer or as an error row with the reason; `replay --resume`
re-sends exactly the error calls; the resumed run's tables then equal a fault-free run's (timing aside); no call
is stored twice. A table of what was injected and what came of it is printed.

Upstream: `batch_size = 1` and no prefix caching, so an answer does not depend on which requests came before or
alongside it (see tests/serve/test_app.py).
"""

from __future__ import annotations

from collections import Counter

import pytest
from click.testing import CliRunner
from compare.test_shards import rows_of
from faultproxy import KINDS, RETRY_AFTER_S, SUCCEEDS, FaultProxy, FaultSchedule, call_keys
from helpers import DEMO, REPO, AppThread, ServeProcess, build_tiny_model, openai_path_toml, torch_path_toml

from toolaudit.cli import cli
from toolaudit.replay.replayer import ReplayOptions, load_calls, replay_traces
from toolaudit.store import Store

LIMIT = 24
TIMEOUT_S = 2.0
MAX_RETRIES = 2
SEED = 25
TOKEN_IDS = "{ return_tokens_as_token_ids = true }"
# wall-clock columns. Left out of the comparison: replay_chunks and path_performance (its sums), which record
# the work each invocation did (a resumed run did more: the first attempt's error calls count there too)
TIMING = ("latency_s", "ttft_s", "tokens_per_s", "wall_s", "reused_prefill_s", "speedup", "wall_share_s")
TABLES = ["calls", "outputs", "arg_diffs", "sessions", "trace_errors", "schema_issues", "call_drift",
          "session_drift", "customer_drift", "tool_drift", "argument_drift"]
# what an error row must say for a fault that never lets up
REASON = {"429_retry_after": "HTTP 429", "429": "HTTP 429", "500": "HTTP 500", "502": "HTTP 502",
          "503": "HTTP 503", "reset_before_body": "connection error", "reset_mid_body": "connection error",
          "truncated_short": "connection error", "stall": "timeout", "slow_loris": "timeout",
          "truncated_honest": "malformed response", "html_200": "malformed response",
          "stream_cut": "malformed response", "stream_cut_after_finish": "malformed response"}


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    root = tmp_path_factory.mktemp("faultproxy")
    serve_file = root / "serve.toml"
    serve_file.write_text(torch_path_toml("tiny", build_tiny_model(root / "tiny"), prefix_caching=False))
    server = ServeProcess(serve_file, "tiny", root / "serve.log")
    try:
        server.wait()
        yield server
    finally:
        assert server.stop() == 0


@pytest.fixture
def proxy(upstream):
    fault_proxy = FaultProxy(upstream.base_url, TIMEOUT_S)
    thread = AppThread(fault_proxy.app())
    fault_proxy.base_url = thread.base_url
    yield fault_proxy
    thread.close()


def paths_file(tmp_path, base_url: str):
    common = {"timeout_s": TIMEOUT_S, "max_retries": MAX_RETRIES, "backoff_s": 0.01, "backoff_max_s": 0.2,
              "logprobs": True, "extra_body": TOKEN_IDS, "batch_size": 4}
    path = tmp_path / "paths.toml"
    path.write_text(openai_path_toml("px", base_url, "tiny", **common)
                    + openai_path_toml("px-stream", base_url, "tiny", stream=True, **common))
    return path


def replay(db, paths) -> tuple[int, object]:
    options = ReplayOptions(traces=[str(DEMO)], baseline="px", candidate="px-stream", paths_file=str(paths),
                            limit=LIMIT, schema_dir=str(REPO / "schemas"))
    with Store(db) as store:
        return replay_traces(store, options)


def outputs(db, run_id: int = 1) -> dict[tuple, dict]:
    timing = set(TIMING)
    with Store(db, read_only=True) as store:
        rows = store.rows("SELECT * FROM outputs WHERE run_id = ?", [run_id])
    return {(r["session_id"], r["call_index"], r["side"]): {k: v for k, v in r.items() if k not in timing}
            for r in rows}


def test_every_fault_ends_as_the_answer_or_an_error_row_and_resume_restores_the_fault_free_run(
        tmp_path, proxy, show_table):
    calls = load_calls(ReplayOptions(traces=[str(DEMO)], limit=LIMIT))[0]
    keys = call_keys(calls)
    assert len({k for pair in keys.values() for k in pair}) == 2 * LIMIT  # attempts count per request
    paths = paths_file(tmp_path, proxy.base_url)

    clean_db = tmp_path / "clean.duckdb"
    _, clean = replay(clean_db, paths)
    want = outputs(clean_db)
    slowest = max(a.answered - a.at for a in proxy.attempts)  # the margin under the client's timeout
    assert clean.errors == 0 and len(proxy.attempts) == 2 * LIMIT, {o["error"] for o in want.values()}
    assert all(o["error"] is None and o["token_ids"] for o in want.values())

    schedule = FaultSchedule.seeded(SEED, list(keys.values()))
    plan = schedule.plan
    assert {f.kind for f in plan.values()} == set(KINDS)  # every kind, and both ways
    assert {(f.kind, f.persistent) for f in plan.values()} >= {(k, p) for k in KINDS if k not in SUCCEEDS
                                                               for p in (False, True)}
    proxy.reset_counts()
    proxy.schedule = schedule
    faulty_db = tmp_path / "faulty.duckdb"
    run_id, counts = replay(faulty_db, paths)
    faulty = proxy.attempts[:]
    injected = proxy.injected
    assert injected == Counter({kind: sum(schedule.attempts(k, MAX_RETRIES) if f.persistent else 1
                                          for k, f in plan.items() if f.kind == kind) for kind in KINDS})
    failing = {call for call, pair in keys.items() if any(schedule.ends_in_error(k) for k in pair)}
    assert counts.errors == len(failing) > 0 and counts.calls == LIMIT

    # each call: the fault-free answer on both sides, or an error row whose reason names the fault
    got = outputs(faulty_db, run_id)
    assert got.keys() == want.keys()
    for (session, index, side), row in got.items():
        fault = plan.get(keys[session, index][side == "candidate"])
        if (session, index) not in failing:
            assert row == want[session, index, side], (fault, row["error"])
        elif schedule.ends_in_error(keys[session, index][side == "candidate"]):
            assert (row["error"] or "").startswith(REASON[fault.kind]), (fault, row["error"])
            assert row["error"].endswith(f"(after {MAX_RETRIES + 1} attempts)"), (fault, row["error"])
    with Store(faulty_db, read_only=True) as store:
        status = {(r[0], r[1]): r[2] for r in store.query(
            "SELECT session_id, call_index, match_status FROM calls WHERE run_id = ?", [run_id])[1]}
    assert {call for call, s in status.items() if s == "error"} == failing

    # attempts per request: persistent faults 1 + max_retries, transient 2, a drip or no fault 1
    seen = Counter(a.key for a in faulty)
    for key in {k for pair in keys.values() for k in pair}:
        assert seen[key] == schedule.attempts(key, MAX_RETRIES), (plan.get(key), seen[key])
    # a 429's Retry-After is a floor under the wait before the next attempt
    by_attempt = {(a.key, a.attempt): a for a in faulty}
    for a in faulty:
        if a.fault == "429_retry_after":
            after = by_attempt.get((a.key, a.attempt + 1))
            if after is not None:
                assert after.at - a.answered >= RETRY_AFTER_S * 0.99, (after.at - a.answered)

    # resume, the proxy fault-free: exactly the error calls are sent again, once per side
    proxy.schedule = None
    proxy.reset_counts()
    result = CliRunner().invoke(cli, ["replay", "--resume", str(run_id), "--db", str(faulty_db)])
    assert result.exit_code == 0, result.output
    resent = Counter(a.key for a in proxy.attempts)
    assert resent == Counter(k for call in failing for k in keys[call])

    # now the tables equal the fault-free run's, and nothing is stored twice
    with Store(clean_db, read_only=True) as a, Store(faulty_db, read_only=True) as b:
        for table in TABLES:
            assert rows_of(a, table, 1, TIMING) == rows_of(b, table, run_id, TIMING), table
        per_call = b.query("""SELECT max(n) FROM (SELECT count(*) AS n FROM calls WHERE run_id = ?
                              GROUP BY session_id, call_index)""", [run_id])[1][0][0]
        per_side = b.query("""SELECT max(n), count(*) FROM (SELECT count(*) AS n FROM outputs WHERE run_id = ?
                              GROUP BY session_id, call_index, side)""", [run_id])[1][0]
        stored_calls = b.query("SELECT count(*) FROM calls WHERE run_id = ?", [run_id])[1][0][0]
        run_status = b.run_row(run_id)["status"]
    assert per_call == 1 and per_side == (1, 2 * LIMIT) and stored_calls == LIMIT and run_status == "complete"

    table = summary_table(schedule, faulty, injected, failing, keys, lost=LIMIT - stored_calls, duplicated=per_call - 1)
    table += f"\nslowest fault-free answer {slowest:.2f} s (timeout_s {TIMEOUT_S:g})"
    show_table(table)


def summary_table(schedule: FaultSchedule, attempts, injected: Counter, failing: set, keys: dict, lost: int,
                  duplicated: int) -> str:
    """Per kind: faults injected, retries they caused, requests that came through, and calls left as error rows
    (a call with a persistent fault on either side) before the resume."""
    retries = Counter(schedule.plan[a.key].kind for a in attempts if a.attempt > 1 and a.key in schedule.plan)
    ok_requests, error_calls = Counter(), Counter()
    for call, pair in keys.items():
        for key in pair:
            f = schedule.plan.get(key)
            if f is None:
                continue
            if schedule.ends_in_error(key):
                error_calls[f.kind] += call in failing
            else:
                ok_requests[f.kind] += 1
    lines = [f"{'fault':<25}{'injected':>9}{'retries':>9}{'ok':>5}{'errors':>8}"]
    for kind in KINDS:
        lines.append(f"{kind:<25}{injected[kind]:>9}{retries[kind]:>9}{ok_requests[kind]:>5}{error_calls[kind]:>8}")
    total_ok = len(keys) - len(failing)
    lines.append(f"calls: {len(keys)}, ok {total_ok}, error rows {len(failing)} (all re-sent and filled by the "
                 f"resume), lost {lost}, duplicated {duplicated}; requests {len(attempts)}, "
                 f"retries {sum(a.attempt > 1 for a in attempts)}")
    return "\n".join(lines)


def test_schedule_is_seeded_and_bounded():
    calls = [(f"p{i}", f"s{i}") for i in range(LIMIT)]
    a, b = FaultSchedule.seeded(1, calls), FaultSchedule.seeded(1, calls)
    assert a.plan == b.plan and a.plan != FaultSchedule.seeded(2, calls).plan
    assert all(f.kind != "stream_cut" for k, f in a.plan.items() if k.startswith("p"))
    assert all(not f.kind.startswith("truncated") for k, f in a.plan.items() if k.startswith("s"))
    f = next(f for f in a.plan.values() if not f.persistent)
    key = next(k for k, v in a.plan.items() if v is f)
    assert a.fault(key, 1) == f and a.fault(key, 2) is None and a.fault("unknown", 1) is None
    assert len(a.plan) <= 2 * LIMIT
