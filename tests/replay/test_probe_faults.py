"""A replay's probe of an endpoint never holds the replay up: through the fault-injecting proxy (tests/faultproxy.py)
in front of `toolaudit serve`'s application (the tiny float32 model, in this process on loopback), with probes on
(the suite turns them off: TOOLAUDIT_NO_PROBE is unset here), a probe that meets a fault is recorded with the run
as unavailable, with the reason, after one attempt of one request (no retry, nothing sent after it), and the
replay stores every call once. Which request meets which fault is the proxy's schedule, by request identity: no
test waits on timing luck (a stall is held until the client gives up, so the probe's deadline always ends it).
"""

from __future__ import annotations

from collections import Counter

import pytest
from click.testing import CliRunner
from faultproxy import Fault, FaultProxy, FaultSchedule, call_keys, request_key
from helpers import DEMO, REPO, AppThread, build_tiny_model, openai_path_toml, torch_path_toml

from toolaudit.cli import cli
from toolaudit.engines.openai.shapes import openai_messages
from toolaudit.replay import probes
from toolaudit.replay.probe_set import run_probe_set
from toolaudit.replay.replayer import ReplayOptions, load_calls
from toolaudit.store import Store
from toolaudit.store.probes import unavailable_probes

pytestmark = pytest.mark.usefixtures("model_available")
LIMIT = 6
TIMEOUT_S = 2.0  # the replay's per-attempt timeout (the proxy holds a stall for twice this at most)
MAX_RETRIES = 2
# what a probe's recorded reason says for each fault
REASON = {"429": "HTTP 429", "429_retry_after": "HTTP 429", "503": "HTTP 503", "500": "HTTP 500",
          "reset_before_body": "connection error", "reset_mid_body": "connection error",
          "truncated_short": "connection error", "truncated_honest": "malformed response",
          "html_200": "malformed response", "stream_cut": "malformed response", "stall": "timeout"}


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    """`toolaudit serve`'s application for the tiny model, in this process on a loopback port: its base URL."""
    from toolaudit.engines.paths import load_paths
    from toolaudit.serve.app import EngineHost, build_app
    from toolaudit.serve.metrics import Metrics

    root = tmp_path_factory.mktemp("probe-faults")
    served = root / "serve.toml"
    served.write_text(torch_path_toml("tiny", build_tiny_model(root / "tiny"), prefix_caching=False)
                      + "threads = 1\n")
    path = load_paths(served)["tiny"]
    host = EngineHost(path, Metrics(path.name))
    app = AppThread(build_app(path, host), on_start=(host.start(),))
    try:
        app.call(host.ready.wait(), timeout=60)
        yield app.base_url
    finally:
        app.close()
        host.close()


@pytest.fixture
def proxy(upstream, monkeypatch):
    monkeypatch.delenv("TOOLAUDIT_NO_PROBE", raising=False)  # probes at their default: on
    fault_proxy = FaultProxy(upstream, TIMEOUT_S)
    thread = AppThread(fault_proxy.app())
    fault_proxy.base_url = thread.base_url
    yield fault_proxy
    thread.close()


def probe_keys(stream: bool) -> list[str]:
    """The proxy's identities of a run probe's requests, in the order the probe sends them."""
    return [request_key(openai_messages(r.messages), stream) for r in run_probe_set().requests]


def replay_keys() -> set[str]:
    calls = load_calls(ReplayOptions(traces=[str(DEMO)], limit=LIMIT))[0]
    return {k for pair in call_keys(calls).values() for k in pair}


def replay(tmp_path, proxy, *extra: str) -> tuple[str, object]:
    """`toolaudit replay` of LIMIT demo calls, baseline `px` (plain) and candidate `px-stream` (streamed), both
    through the proxy; returns the output and the database."""
    common = {"timeout_s": TIMEOUT_S, "max_retries": MAX_RETRIES, "backoff_s": 0.01, "backoff_max_s": 0.05,
              "logprobs": True}
    paths = tmp_path / "paths.toml"
    paths.write_text(openai_path_toml("px", proxy.base_url, "tiny", **common)
                     + openai_path_toml("px-stream", proxy.base_url, "tiny", stream=True, **common))
    db = tmp_path / "r.duckdb"
    result = CliRunner().invoke(cli, ["replay", str(DEMO), "--limit", str(LIMIT), "--baseline", "px",
                                      "--candidate", "px-stream", "--paths", str(paths), "--db", str(db),
                                      "--schemas", str(REPO / "schemas"), *extra])
    assert result.exit_code == 0, result.output
    return result.output, db


def stored_once(db) -> dict:
    """Per run: calls stored, the most rows of one call, error rows, status."""
    with Store(db, read_only=True) as store:
        return {"calls": store.query("SELECT count(*) FROM calls WHERE run_id = 1")[1][0][0],
                "most": store.query("SELECT max(n) FROM (SELECT count(*) AS n FROM calls WHERE run_id = 1 GROUP BY "
                                    "session_id, call_index)")[1][0][0],
                "errors": store.query("SELECT count(*) FROM calls WHERE run_id = 1 AND match_status = 'error'"
                                      )[1][0][0],
                "status": store.run_row(1)["status"]}


@pytest.mark.parametrize("plain, streamed", [("503", "429_retry_after"), ("reset_before_body", "reset_mid_body"),
                                             ("truncated_short", "stream_cut"), ("html_200", "500"),
                                             ("stall", "stall")])
def test_a_probe_that_meets_a_fault_is_unavailable_and_the_replay_goes_on(tmp_path, proxy, monkeypatch, plain,
                                                                          streamed):
    """Every probe request faulted, persistently (the 41 faults a probe once met): each path's probe sends one
    request, once, and is recorded as unavailable with the fault; the replay's calls, which meet no fault, are
    all stored once, with no error row."""
    if "stall" in (plain, streamed):
        # held until the client gives up (or 2 x TIMEOUT_S): the probe's deadline, set below that, always ends it
        monkeypatch.setattr(probes, "ENDPOINT_DEADLINE_S", 1.0)
    keys = {False: probe_keys(False), True: probe_keys(True)}
    assert not (set(keys[False]) | set(keys[True])) & replay_keys()  # the faults are the probes' alone
    proxy.schedule = FaultSchedule({k: Fault(plain if not stream else streamed, persistent=True)
                                    for stream, ks in keys.items() for k in ks})
    output, db = replay(tmp_path, proxy)

    seen = {k: proxy.seen[k] for ks in keys.values() for k in ks}
    assert seen == {k: int(i == 0) for ks in keys.values() for i, k in enumerate(ks)}  # one attempt, then none
    assert proxy.injected == Counter({plain: 1, streamed: 1}) if plain != streamed else Counter({plain: 2})
    assert stored_once(db) == {"calls": LIMIT, "most": 1, "errors": 0, "status": "complete"}
    with Store(db, read_only=True) as store:
        missing = unavailable_probes(store, 1)
        assert store.query("SELECT count(*) FROM probes")[1][0][0] == 0
    assert [(m["side"], m["path_name"]) for m in missing] == [("baseline", "px"), ("candidate", "px-stream")]
    for m, kind in zip(missing, (plain, streamed)):
        assert f"probe prompt 1 of {len(keys[False])} failed: {REASON[kind]}" in m["reason"], (kind, m["reason"])
    assert "warning: probe of baseline px unavailable, the run records why:" in output


def test_a_fault_midway_stops_the_probe_there_and_a_clean_probe_is_stored(tmp_path, proxy):
    """The baseline's third probe request meets a transient 429 (a retry would pass it): no retry, nothing after
    it, the probe unavailable; the candidate's probe meets no fault and is stored, the run's small probe."""
    plain = probe_keys(False)
    proxy.schedule = FaultSchedule({plain[2]: Fault("429_retry_after", persistent=False)})
    _, db = replay(tmp_path, proxy)

    assert [proxy.seen[k] for k in plain] == [1, 1, 1, 0, 0, 0]
    assert all(proxy.seen[k] == 1 for k in probe_keys(True))
    assert stored_once(db) == {"calls": LIMIT, "most": 1, "errors": 0, "status": "complete"}
    with Store(db, read_only=True) as store:
        (missing,) = unavailable_probes(store, 1)
        rows = store.rows("SELECT run_id, side, path_name, prompts, repeats, probe_set, numerics FROM probes")
    assert missing["path_name"] == "px" and "probe prompt 3 of 6 failed: HTTP 429" in missing["reason"]
    (row,) = rows
    assert (row["run_id"], row["side"], row["path_name"], row["prompts"], row["repeats"], row["probe_set"]) == (
        1, "candidate", "px-stream", 6, 1, run_probe_set().digest)
    assert row["numerics"].startswith("num-")
    _said_by_summary_and_history(db, ("baseline", "px", "probe prompt 3 of 6 failed: HTTP 429"))


def _said_by_summary_and_history(db, unavailable: tuple[str, str, str]) -> None:
    """The run's summary (screen and --json) and its history row say which probe is unavailable and why."""
    import json

    side, path, why = unavailable
    screen = CliRunner().invoke(cli, ["summary", "--run", "1", "--db", str(db)])
    assert screen.exit_code == 0, screen.output
    assert any(line.split()[:4] == ["probe", "unavailable", side, f"{path}:"] and why in line
               for line in screen.output.splitlines()), screen.output
    summary = json.loads(CliRunner().invoke(cli, ["summary", "--run", "1", "--json", "--db", str(db)]).output)
    (entry,) = summary["probes_unavailable"]
    assert (entry["side"], entry["path_name"]) == (side, path) and why in entry["reason"]
    history = json.loads(CliRunner().invoke(cli, ["history", "--json", "--db", str(db)]).output)
    (row,) = [r for series in history["series"] for r in series["rows"] if r["run_id"] == 1]
    assert why in row[f"{side}_probe_unavailable"] and row["candidate_probe_unavailable"] is None


def test_faults_on_the_probe_and_the_replay_then_one_resume(tmp_path, proxy):
    """The replay's own calls meet the seeded faults (transient: the retry recovers; persistent: an error row)
    and every probe request a persistent one. The run completes; one `--resume`, the proxy clean, sends exactly
    the error calls again and no probe: every call is then stored once, with no error row."""
    calls = load_calls(ReplayOptions(traces=[str(DEMO)], limit=LIMIT))[0]
    keys = call_keys(calls)
    schedule = FaultSchedule.seeded(3, list(keys.values()), kinds=("429", "500", "reset_before_body",
                                                                    "truncated_honest", "html_200", "stream_cut"))
    probe_faults = {k: Fault("503", persistent=True) for k in probe_keys(False) + probe_keys(True)}
    assert not probe_faults.keys() & schedule.plan.keys()
    proxy.schedule = FaultSchedule({**schedule.plan, **probe_faults})
    output, db = replay(tmp_path, proxy)
    failing = {call for call, pair in keys.items() if any(schedule.ends_in_error(k) for k in pair)}
    first = stored_once(db)
    assert first == {"calls": LIMIT, "most": 1, "errors": len(failing), "status": "complete"} and failing
    assert sum(proxy.seen[k] for k in probe_faults) == 2  # one request per path's probe

    proxy.schedule = None
    proxy.reset_counts()
    result = CliRunner().invoke(cli, ["replay", "--resume", "1", "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert Counter(a.key for a in proxy.attempts) == Counter(k for call in failing for k in keys[call])
    assert stored_once(db) == {"calls": LIMIT, "most": 1, "errors": 0, "status": "complete"}
    with Store(db, read_only=True) as store:
        assert len(unavailable_probes(store, 1)) == 2
