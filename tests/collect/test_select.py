"""Reading collected traffic back: the window (`--since`), the deterministic sample of whole sessions
(`--sample`, `--per-customer`, `--seed`) and one service's spans, read through the real `otel` reader."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone

import pytest

from toolaudit import ConfigError
from toolaudit.collect.files import CollectedFiles
from toolaudit.collect.select import Selection, parse_duration, select_collected
from toolaudit.ingest.traces import read_trace

from .support import attr, chat_attrs, export, span

HOUR_NS = 3600 * 10**9


def collect_lines(folder, requests: list[tuple[datetime, dict]]) -> None:
    files = CollectedFiles(folder)
    try:
        for when, request in requests:
            files.append(json.dumps(request).encode(), now=when)
    finally:
        files.close()


def calls_of(path) -> list:
    return [c for c in read_trace(path, require_response=False)]


def traffic(customers: int, sessions: int, calls: int, start_ns: int) -> list[dict]:
    """Each session one trace: its chat spans and an execute_tool span (context the readers skip)."""
    out = []
    for c in range(customers):
        for s in range(sessions):
            trace = f"{c:02d}{s:02d}".ljust(32, "a")
            spans = [span(chat_attrs(f"c{c}-s{s}", f"cust{c}", prompt=f"q{k}"), start_ns + k, trace_id=trace)
                     for k in range(calls)]
            spans.append(span([attr("gen_ai.operation.name", "execute_tool")], start_ns, trace_id=trace,
                              name="execute_tool search"))
            out.append(export(*spans))
    return out


def test_since_keeps_recent_traces_and_skips_old_hourly_files(tmp_path):
    now = datetime.now(timezone.utc)
    now_ns = time.time_ns()
    old = export(span(chat_attrs("old", "acme"), now_ns - 48 * HOUR_NS))
    new = export(span(chat_attrs("new", "acme"), now_ns - HOUR_NS))
    # spans that claim to be recent in a file received three days ago: never opened with --since 24h
    stale = export(span(chat_attrs("stale-file", "acme"), now_ns))
    collect_lines(tmp_path / "c", [(now - timedelta(days=3), stale), (now, old), (now, new)])
    every = select_collected(tmp_path / "c", tmp_path / "all.jsonl", Selection())
    assert every.sessions == {"old", "new", "stale-file"} and every.files == 2
    recent = select_collected(tmp_path / "c", tmp_path / "recent.jsonl", Selection(since="24h"))
    assert recent.sessions == {"new"} and recent.files == 1
    assert [c.session_id for c in calls_of(recent.path)] == ["new"]
    with pytest.raises(ConfigError, match="no usable model call collected in .* in the last 30m"):
        select_collected(tmp_path / "c", tmp_path / "none.jsonl", Selection(since="30m"))
    with pytest.raises(ConfigError, match="no collected files"):
        select_collected(tmp_path / "empty", tmp_path / "none.jsonl", Selection())


def test_a_sample_per_customer_keeps_whole_sessions_deterministically(tmp_path):
    now = datetime.now(timezone.utc)
    collect_lines(tmp_path / "c", [(now, r) for r in traffic(3, 5, 2, time.time_ns())])
    per_customer = Selection(sample=2, per_customer=True)
    first = select_collected(tmp_path / "c", tmp_path / "a.jsonl", per_customer)
    again = select_collected(tmp_path / "c", tmp_path / "b.jsonl", per_customer)
    assert first.sessions == again.sessions and first.path.read_bytes() == again.path.read_bytes()
    assert first.calls == 12 and first.customers == {"cust0", "cust1", "cust2"}
    calls = calls_of(first.path)
    by_customer: dict[str, set] = {}
    for call in calls:
        by_customer.setdefault(call.customer, set()).add(call.session_id)
    assert {k: len(v) for k, v in by_customer.items()} == {"cust0": 2, "cust1": 2, "cust2": 2}
    # whole sessions, and their traces' context spans with them
    assert sorted((c.session_id, c.call_index) for c in calls) == sorted(
        (s, k) for s in first.sessions for k in (0, 1))
    lines = [json.loads(line) for line in first.path.read_text().splitlines()]
    names = [s["name"] for doc in lines for s in doc["resourceSpans"][0]["scopeSpans"][0]["spans"]]
    assert names.count("execute_tool search") == 6
    # overall: 4 sessions of any customer; another seed draws others
    overall = select_collected(tmp_path / "c", tmp_path / "o.jsonl", Selection(sample=4))
    assert len(overall.sessions) == 4 and overall.calls == 8
    draws = {frozenset(select_collected(tmp_path / "c", tmp_path / f"s{k}.jsonl",
                                        Selection(sample=4, seed=str(k))).sessions) for k in range(4)}
    assert len(draws) > 1


def test_one_service_and_the_sessions_drawn_on_the_other_side(tmp_path):
    now = datetime.now(timezone.utc)
    t = time.time_ns()
    requests = [export(span(chat_attrs(f"s{k}", "acme"), t), service=service)
                for k in range(6) for service in ("prod", "canary")]
    collect_lines(tmp_path / "c", [(now, r) for r in requests])
    prod = select_collected(tmp_path / "c", tmp_path / "prod.jsonl", Selection(sample=3, service="prod"))
    assert prod.calls == 3
    canary = select_collected(tmp_path / "c", tmp_path / "canary.jsonl",
                              Selection(service="canary", sessions=frozenset(prod.sessions)))
    assert canary.sessions == prod.sessions
    services = {a["value"]["stringValue"] for line in canary.path.read_text().splitlines()
                for rs in json.loads(line)["resourceSpans"] for a in rs["resource"]["attributes"]}
    assert services == {"canary"}
    with pytest.raises(ConfigError, match="none of the 1 sessions drawn"):
        select_collected(tmp_path / "c", tmp_path / "x.jsonl", Selection(service="canary",
                                                                        sessions=frozenset({"other"})))


def test_durations():
    assert [parse_duration(t) for t in ("90s", "30m", "24h", "7d", "1.5h")] == [90, 1800, 86400, 604800, 5400]
    with pytest.raises(ConfigError, match="e.g. 24h"):
        parse_duration("yesterday")
