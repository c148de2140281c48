"""Sharded runs (`--shard K/N`) merged with `toolaudit merge` equal one unsharded run, row for row."""

from __future__ import annotations

import hashlib
import json

import pytest
from click.testing import CliRunner
from conftest import REPO, line, tool_call, write_jsonl

from toolaudit import ConfigError, StoreError
from toolaudit.cli import cli
from toolaudit.compare.logs import CompareOptions, compare_logs
from toolaudit.engines import Engine, EngineResult
from toolaudit.ingest.shards import Shard, parse_shard, shard_of
from toolaudit.replay.replayer import ReplayOptions, replay_traces
from toolaudit.store import Store
from toolaudit.store.combine import merge_runs

BASELINE = REPO / "traces" / "example_baseline.jsonl"
CANDIDATE = REPO / "traces" / "example_candidate.jsonl"
TABLES = ["calls", "outputs", "arg_diffs", "sessions", "trace_errors", "schema_issues", "replay_chunks",
          "call_drift", "session_drift", "customer_drift", "tool_drift", "argument_drift", "path_performance"]


def rows_of(store: Store, table: str, run_id: int, leave_out: tuple[str, ...] = ()) -> list[tuple]:
    """A table's or view's rows of one run, without the run id and name, in a fixed order."""
    cols = [r[0] for r in store.query("SELECT column_name FROM information_schema.columns WHERE table_name = ? "
                                      "ORDER BY ordinal_position", [table])[1]
            if r[0] not in ("run_id", "run_name", *leave_out)]
    return store.query(f"SELECT {', '.join(cols)} FROM {table} WHERE run_id = ? ORDER BY ALL", [run_id])[1]


def invoke(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def summary_json(db, run_id: int) -> dict:
    out = json.loads(invoke("summary", "--db", str(db), "--run", str(run_id), "--json"))
    for key in ("run_id", "run_name", "errors_sql", "schema_issues_sql"):
        out.pop(key)
    return out


def test_shard_of_is_stable_and_parse_validates():
    # the documented rule: sha1 of the UTF-8 session id, first 8 bytes big-endian, mod N, plus 1
    expected = int.from_bytes(hashlib.sha1(b"session-42").digest()[:8], "big") % 7 + 1
    assert shard_of("session-42", 7) == expected
    assert all(shard_of(f"s{i}", 1) == 1 for i in range(20))
    assert parse_shard("2/3") == Shard(2, 3) and parse_shard(None) is None
    for bad in ("0/3", "4/3", "3", "a/b", "1/0", "-1/2"):
        with pytest.raises(ConfigError):
            parse_shard(bad)


def test_three_shards_merged_equal_one_run(tmp_path):
    one = tmp_path / "one.duckdb"
    invoke("compare", str(BASELINE), str(CANDIDATE), "--db", str(one))
    shards = []
    for k in (1, 2, 3):
        shards.append(tmp_path / f"s{k}.duckdb")
        invoke("compare", str(BASELINE), str(CANDIDATE), "--db", str(shards[-1]), "--shard", f"{k}/3")
    with Store(shards[1], read_only=True) as store:
        options = json.loads(store.run_row(None)["options"])
        assert options["shard"] == {"index": 2, "count": 3}
    merged = tmp_path / "all.duckdb"
    invoke("merge", str(shards[2]), str(shards[0]), str(shards[1]), "--db", str(merged))
    with Store(one, read_only=True) as a, Store(merged, read_only=True) as b:
        assert b.run_row(1)["status"] == "complete"
        for table in TABLES:
            assert rows_of(a, table, 1) == rows_of(b, table, 1), table
        assert rows_of(a, "calls", 1)  # not vacuous
    assert summary_json(one, 1) == summary_json(merged, 1)
    check = ("check", "--max-call-drift", "2%", "--max-session-drift", "10%")
    assert CliRunner().invoke(cli, [*check, "--db", str(one)]).output == \
        CliRunner().invoke(cli, [*check, "--db", str(merged)]).output
    for db in (one, merged):
        invoke("report", "--db", str(db), "--all-customers", "--write", "json", "-o", str(tmp_path / db.stem))
    for path in sorted((tmp_path / "one").rglob("*.json")):
        other = tmp_path / "all" / path.relative_to(tmp_path / "one")
        a, b = json.loads(path.read_text()), json.loads(other.read_text())
        for d in (a, b):  # timestamps aside
            d["report"].pop("generated_at")
            for key in ("created_at", "finished_at"):
                d["run"].pop(key, None)
        assert a == b, path.name


def _logs_with_bad_lines(tmp_path):
    base, cand = [], []
    for s in range(40):
        for i in range(3):
            args = {"query": f"q{s}", "limit": 10 + i}
            drift = {"query": f"q{s}", "limit": 99} if (s * 3 + i) % 7 == 0 else args
            base.append(line(session=f"sess-{s}", customer=f"c{s % 3}", calls=[tool_call("search_tickets", args)]))
            cand.append(line(session=f"sess-{s}", customer=f"c{s % 3}", calls=[tool_call("search_tickets", drift)]))
    cand.append(line(session="only-candidate", calls=[tool_call("close_ticket", {"ticket_id": 1})]))
    b = write_jsonl(tmp_path / "b.jsonl", base)
    c = write_jsonl(tmp_path / "c.jsonl", cand)
    with open(b, "a") as fh:
        fh.write("{not json\n\n[1, 2]\n")
    return b, c


def test_shards_store_bad_lines_once_and_counts_add_up(tmp_path):
    b, c = _logs_with_bad_lines(tmp_path)
    with Store(tmp_path / "one.duckdb") as store:
        _, whole = compare_logs(store, b, c, CompareOptions(schema_dir=None))
    dbs = []
    for k in (1, 2, 3, 4):
        dbs.append(str(tmp_path / f"s{k}.duckdb"))
        with Store(dbs[-1]) as store:
            _, counts = compare_logs(store, b, c, CompareOptions(schema_dir=None, shard=Shard(k, 4), workers=1))
            stats = counts.baseline
            assert stats.records == stats.calls + stats.errors + stats.skipped + counts.shard["elsewhere"]["baseline"]
            errors = store.query("SELECT count(*) FROM trace_errors")[1][0][0]
            assert errors == (2 if k == 1 else 0)  # rows of no session: shard 1's
    with Store(tmp_path / "all.duckdb") as store:
        result = merge_runs(store, dbs)
        assert result.status == "complete" and result.calls == whole.matched + whole.candidate_only
        merged = json.loads(store.run_row(result.run_id)["counts"])
    assert merged == json.loads(json.dumps(whole.as_dict()))
    with Store(tmp_path / "one.duckdb", read_only=True) as a, Store(tmp_path / "all.duckdb", read_only=True) as m:
        for table in TABLES:
            assert rows_of(a, table, 1) == rows_of(m, table, 1), table


def test_merge_refuses_what_would_count_twice_or_mix_comparisons(tmp_path):
    b, c = _logs_with_bad_lines(tmp_path)

    def shard_db(name, shard, **opts):
        path = str(tmp_path / name)
        with Store(path) as store:
            compare_logs(store, b, c, CompareOptions(schema_dir=None, shard=shard, **opts))
        return path

    s1, s2 = shard_db("s1.duckdb", Shard(1, 2)), shard_db("s2.duckdb", Shard(2, 2))
    again = shard_db("s1b.duckdb", Shard(1, 2))
    other_n = shard_db("t1.duckdb", Shard(1, 3))
    renamed = shard_db("r2.duckdb", Shard(2, 2), candidate_name="spec")
    keyed = shard_db("k2.duckdb", Shard(2, 2), customer_key="request.metadata.tenant")
    whole = shard_db("whole.duckdb", None)
    cases = [([s1, s1], "given twice"), ([s1, again], "given twice"), ([s1, other_n], "different N"),
             ([s1, renamed], "candidate_name differs"), ([s1, keyed], "options differ"),
             ([whole, s1], "different N"), ([whole, whole], "given twice")]
    for inputs, reason in cases:
        with Store(tmp_path / "out.duckdb") as store:
            with pytest.raises(StoreError, match=reason):
                merge_runs(store, inputs)
            assert store.query("SELECT count(*) FROM runs")[1][0][0] == 0  # nothing written
    with Store(s1) as store:
        store.set_status(1, "interrupted")
    with Store(tmp_path / "out.duckdb") as store, pytest.raises(StoreError, match="not complete"):
        merge_runs(store, [s1, s2])
    with Store(tmp_path / "out.duckdb") as store, pytest.raises(StoreError, match="is the --db"):
        merge_runs(store, [str(tmp_path / "out.duckdb"), s2])


def test_missing_shards_merge_into_a_partial_run(tmp_path):
    b, c = _logs_with_bad_lines(tmp_path)
    dbs = []
    for k in (1, 3):
        dbs.append(str(tmp_path / f"s{k}.duckdb"))
        with Store(dbs[-1]) as store:
            compare_logs(store, b, c, CompareOptions(schema_dir=None, shard=Shard(k, 3)))
    out = CliRunner().invoke(cli, ["merge", *dbs, "--db", str(tmp_path / "m.duckdb")])
    assert out.exit_code == 0 and "shards 2 of 3 are missing" in out.output
    with Store(tmp_path / "m.duckdb", read_only=True) as store:
        run = store.run_row(None)
        assert run["status"] == "partial"
        assert json.loads(run["options"])["shards_missing"] == [2]
        assert json.loads(run["counts"])["shards"] == {"count": 3, "merged": [1, 3], "missing": [2]}


class _EchoEngine(Engine):
    """Deterministic per request: calls search_tickets with the user text; drifts on every 5th session. Stands
    in for the openai engine the paths name (no server needed)."""

    name = "openai"

    def generate(self, requests):
        out = []
        for r in requests:
            session, index = r.key.split("\x1f")
            limit = 7 if self.path.name == "tiny-spec" and sum(map(ord, session)) % 5 == 0 and index == "0" else 5
            text = json.dumps({"name": "search_tickets", "arguments": {"query": session, "limit": limit}})
            out.append(EngineResult(r.key, text=f"<tool_call>{text}</tool_call>", completion_tokens=3))
        return out

    def path_components(self):
        return {"echo": True, "path": self.path.name}


def test_replay_shards_merge_to_the_unsharded_replay(tmp_path):
    paths = tmp_path / "paths.toml"
    paths.write_text('[paths.tiny]\nengine = "openai"\nmodel = "m"\nbase_url = "http://127.0.0.1:9"\n'
                     '[paths.tiny-spec]\nengine = "openai"\nmodel = "m"\nbase_url = "http://127.0.0.1:9"\n')
    b, _ = _logs_with_bad_lines(tmp_path)

    def opts(shard=None):
        return ReplayOptions(traces=[str(b)], baseline="tiny", candidate="tiny-spec", paths_file=str(paths),
                             schema_dir=None, chunk=8, shard=shard)

    with Store(tmp_path / "one.duckdb") as store:
        replay_traces(store, opts(), engine_factory=_EchoEngine)
    dbs = []
    for k in (1, 2):
        dbs.append(str(tmp_path / f"r{k}.duckdb"))
        with Store(dbs[-1]) as store:
            replay_traces(store, opts({"index": k, "count": 2}), engine_factory=_EchoEngine)
    with Store(tmp_path / "all.duckdb") as store:
        merge_runs(store, dbs)
    with Store(tmp_path / "one.duckdb", read_only=True) as a, Store(tmp_path / "all.duckdb", read_only=True) as m:
        for table in ("calls", "outputs", "arg_diffs", "sessions", "trace_errors", "call_drift", "session_drift",
                      "customer_drift", "tool_drift", "argument_drift"):
            timing = ("latency_s", "ttft_s", "tokens_per_s", "wall_share_s")  # wall-clock dependent
            assert rows_of(a, table, 1, timing) == rows_of(m, table, 1, timing), table
        assert rows_of(m, "trace_errors", 1) and rows_of(m, "arg_diffs", 1)
        one_counts, all_counts = (json.loads(s.run_row(1)["counts"]) for s in (a, m))
        for key in ("calls", "errors"):
            assert one_counts["replay"][key] == all_counts["replay"][key]
        # both shards' engine calls, numbered one after the other
        n, distinct, top, calls = m.query("""SELECT count(*), count(DISTINCT (chunk_no, side)), max(chunk_no),
                                             sum(calls) FROM replay_chunks""")[1][0]
        assert n == distinct == 2 * (top + 1) and calls == a.query("SELECT sum(calls) FROM replay_chunks")[1][0][0]
