"""CLI answers that used to mislead: a compare of empty logs that left a run of 0 calls, usage errors that exited 1,
DuckDB's own words for an unknown table or a --db that cannot be a database, `--path-pair` given one name, a probe
compared with another path's, and `summary` while a writer has not yet stored its run. Real DuckDB files under
tmp_path, the CLI through click's runner; no model is decoded (a probe is faked where one would run)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import line, tool_call, write_jsonl

from toolaudit.cli import cli
from toolaudit.store import Store

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "traces" / "demo.jsonl"
GOOD = line(calls=[tool_call("close_ticket", {"ticket_id": 1})])


def invoke(*args: str):
    return CliRunner().invoke(cli, [str(a) for a in args])


def compared(tmp_path: Path) -> Path:
    """A database holding one complete compare run."""
    good = write_jsonl(tmp_path / "good.jsonl", [GOOD])
    db = tmp_path / "audit.duckdb"
    assert invoke("compare", good, good, "--db", db).exit_code == 0
    return db


def rows_per_table(db: Path) -> dict[str, int]:
    with Store(db, read_only=True) as store:
        tables = [r["table_name"] for r in store.rows(
            "SELECT table_name FROM information_schema.tables WHERE table_type = 'BASE TABLE'")]
        return {t: store.rows(f'SELECT count(*) AS n FROM "{t}"')[0]["n"] for t in tables}


# -- 1. a compare that reads no call leaves nothing ----------------------------------------------------------------

def test_a_compare_of_two_empty_logs_leaves_no_run(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    db = tmp_path / "new.duckdb"
    result = invoke("compare", empty, empty, "--db", db)
    assert result.exit_code == 1 and f"{empty}: file is empty" in result.output, result.output
    assert not db.exists()  # no run of 0 calls, so no database at all

    db = compared(tmp_path)
    before = rows_per_table(db)
    again = invoke("compare", empty, empty, "--db", db)
    assert again.exit_code == 1 and f"{empty}: file is empty" in again.output
    assert rows_per_table(db) == before  # no run row, no other row
    summary = invoke("summary", "--db", db, "--json")
    assert summary.exit_code == 0 and '"status": "complete"' in summary.output


def test_a_compare_whose_logs_hold_no_usable_call_names_each_and_keeps_no_error_rows(tmp_path):
    db = compared(tmp_path)
    before = rows_per_table(db)
    empty, bad = tmp_path / "empty.jsonl", write_jsonl(tmp_path / "bad.jsonl", [b"{", b"[]"])
    empty.write_bytes(b"\n")
    result = invoke("compare", empty, bad, "--db", db)
    assert result.exit_code == 1
    assert f"{empty}: file is empty" in result.output and f"{bad}: no usable calls" in result.output
    good = tmp_path / "good.jsonl"
    one_bad = invoke("compare", good, bad, "--db", db)  # the bad log's error rows were written, then discarded
    assert one_bad.exit_code == 1 and f"{bad}: no usable calls" in one_bad.output
    matrix = invoke("compare", empty, good, good, "--candidate-name", "a", "--candidate-name", "b", "--db", db)
    assert matrix.exit_code == 1 and f"{empty}: file is empty" in matrix.output
    assert rows_per_table(db) == before


# -- 2. usage errors exit 2 ----------------------------------------------------------------------------------------

def test_a_missing_trace_file_or_unknown_path_or_samples_without_temperature_exit_2(tmp_path):
    db = tmp_path / "x.duckdb"
    good = write_jsonl(tmp_path / "good.jsonl", [GOOD])
    missing = invoke("compare", good, tmp_path / "nope.jsonl", "--db", db)
    assert missing.exit_code == 2 and "nope.jsonl: cannot open trace file" in missing.output, missing.output
    assert not db.exists()
    replay_missing = invoke("replay", tmp_path / "nope.jsonl", "--db", db)
    assert replay_missing.exit_code == 2 and "nope.jsonl: trace file not found" in replay_missing.output
    unknown = invoke("replay", DEMO, "--baseline", "nosuch", "--db", db)
    assert unknown.exit_code == 2 and "unknown decode path 'nosuch'" in unknown.output, unknown.output
    assert "replay --help' for help." in unknown.output  # a usage error, said as click says its own
    greedy = invoke("replay", DEMO, "--samples", "4", "--db", db)
    assert greedy.exit_code == 2 and "samples per call need temperature > 0" in greedy.output, greedy.output
    fingerprint = invoke("fingerprint", "--path", "nosuch")
    assert fingerprint.exit_code == 2 and "unknown decode path 'nosuch'" in fingerprint.output
    assert not db.exists()


def test_failures_while_running_still_exit_1(tmp_path):
    paths = tmp_path / "paths.toml"
    paths.write_text('[paths.a]\nengine = "nope"\n')
    bad_config = invoke("replay", DEMO, "--paths", paths, "--baseline", "a", "--candidate", "a", "--db",
                        tmp_path / "x.duckdb")
    assert bad_config.exit_code == 1 and "engine must be one of" in bad_config.output
    no_calls = write_jsonl(tmp_path / "bad.jsonl", [b"{"])
    assert invoke("compare", no_calls, no_calls, "--db", tmp_path / "x.duckdb").exit_code == 1


# -- 3. sql: an unknown table lists toolaudit's ----------------------------------------------------------------------

def test_sql_on_an_unknown_table_lists_toolaudits_tables_and_views(tmp_path):
    db = compared(tmp_path)
    result = invoke("sql", "select * from nosuch", "--db", db)
    assert result.exit_code == 1
    message = result.output
    assert "SQL error: unknown table nosuch; toolaudit's views: " in message, message
    assert all(name in message for name in ("call_drift", "tool_drift", "customer_drift", "calls", "runs"))
    assert "pg_description" not in message and "Did you mean" not in message and "schema_migrations" not in message
    typo = invoke("sql", "select * from call_drif", "--db", db)
    assert "unknown table call_drif (did you mean call_drift?)" in typo.output
    other = invoke("sql", "select nosuchcolumn from calls", "--db", db)  # any other error: DuckDB's words
    assert other.exit_code == 1 and "Referenced column" in other.output


# -- 4. a --db that cannot be a database ---------------------------------------------------------------------------

def test_a_db_in_a_missing_folder_names_the_folder(tmp_path):
    good = write_jsonl(tmp_path / "good.jsonl", [GOOD])
    db = tmp_path / "no" / "such" / "x.duckdb"
    for args in (("compare", good, good), ("summary",), ("runs",)):
        result = invoke(*args, "--db", db)
        assert result.exit_code == 2, (args, result.output)
        assert f"the folder {db.parent} does not exist" in result.output and "IO Error" not in result.output
    assert not (tmp_path / "no").exists()


def test_a_trace_file_given_as_db_is_said_to_be_one_and_kept(tmp_path):
    trace = write_jsonl(tmp_path / "demo.jsonl", [GOOD])
    held = trace.read_bytes()
    for args in (("summary",), ("compare", trace, trace)):
        result = invoke(*args, "--db", trace)
        assert result.exit_code == 1, result.output
        assert "not a toolaudit database: it looks like a trace (JSON lines) file" in result.output
        assert "remove" not in result.output and "delete" not in result.output
    assert trace.read_bytes() == held


# -- 5. history --path-pair given one name ---------------------------------------------------------------------------

def test_path_pair_given_one_name_shows_the_spelling(tmp_path):
    db = compared(tmp_path)
    one = invoke("history", "--path-pair", "target", "--db", db)
    assert one.exit_code == 2 and "unexpected extra argument" not in one.output, one.output
    assert "--path-pair target CANDIDATE" in one.output and "then the option --db" in one.output
    colon = invoke("history", "--path-pair", "target:spec-ngram", "--db", db)
    assert colon.exit_code == 2 and "--path-pair target spec-ngram" in colon.output
    pair = invoke("history", "--path-pair", "baseline", "candidate", "--db", db)
    assert pair.exit_code == 0 and "baseline vs candidate: 1 run" in pair.output, pair.output


# -- 6. a probe compared only with its own path's ------------------------------------------------------------------

@pytest.fixture
def fake_probe(monkeypatch):
    """`probe` as if the path decoded its set: the same traces every time (no model is loaded)."""
    from toolaudit.replay import probe as probe_module
    from toolaudit.replay.probe import Probe, PromptTrace, decisions_hash, numerics_hash

    def traces(n: int) -> list:
        return [PromptTrace([1, 2], [-0.5, -0.25], [1.0, 1.0], [[(1, -0.5)], [(2, -0.25)]]) for _ in range(n)]

    def fake(path, probe_set, repeats, **_):
        t = traces(len(probe_set))
        return Probe(path.name, path.engine, "fp-a", probe_set.digest, len(probe_set), repeats, decisions_hash(t),
                     numerics_hash(t), True, None, None, 0.1, traces=t, source=probe_set.source)

    monkeypatch.setattr(probe_module, "probe", fake)
    return fake


def test_a_runs_probe_of_another_path_is_not_compared_silently(tmp_path, fake_probe):
    from toolaudit.engines.paths import builtin_paths
    from toolaudit.replay.probe_set import run_probe_set
    from toolaudit.store.probes import insert_probe

    db = tmp_path / "audit.duckdb"
    with Store(db) as store:
        run_id = store.create_run("replay", "nightly", "target", "spec-ngram", "t", "c", {})
        store.finish_run(run_id, {})
        recorded = fake_probe(builtin_paths()["spec-ngram"], run_probe_set(), 1)
        probe_id = insert_probe(store, recorded.row(run_id=run_id, side="candidate"))
    other = invoke("fingerprint", "--probe", "--path", "target", "--against", f"run:{run_id}", "--db", db)
    assert other.exit_code == 2, other.output
    assert f"run {run_id} recorded no probe of path target, only of spec-ngram (candidate: probe {probe_id})" in (
        other.output)
    assert f"--against probe:{probe_id}" in other.output
    same = invoke("fingerprint", "--probe", "--path", "spec-ngram", "--against", f"run:{run_id}", "--db", db)
    assert same.exit_code == 0 and f"against probe {probe_id} (spec-ngram, fp-a): identical" in same.output
    named = invoke("fingerprint", "--probe", "--path", "target", "--against", f"probe:{probe_id}", "--db", db)
    assert named.exit_code == 0, named.output  # the user named that probe: compared, and said to be another path's
    assert f"note: probe {probe_id} is of path spec-ngram, this one of target" in named.output


def test_a_comparison_of_different_probe_sets_exits_non_zero(tmp_path, fake_probe):
    from toolaudit.engines.paths import builtin_paths
    from toolaudit.replay.probe_set import load_probe_set
    from toolaudit.store.probes import insert_probe

    db = tmp_path / "audit.duckdb"
    gone = load_probe_set()
    with Store(db) as store:
        old = fake_probe(builtin_paths()["target"], gone, 1)
        old.probe_set, old.source = "a-set-no-longer-there", str(tmp_path / "deleted-probes.jsonl")
        probe_id = insert_probe(store, old.row())
    for extra in ((), ("--json",)):
        result = invoke("fingerprint", "--probe", "--path", "target", "--against", f"probe:{probe_id}", "--db", db,
                        *extra)
        assert result.exit_code == 1, result.output
        assert "different probe sets: nothing to compare" in result.output


# -- 7. summary while a writer has not stored its run yet ----------------------------------------------------------

WRITER = textwrap.dedent("""
    import sys
    from toolaudit.store import Store

    store = Store(sys.argv[1])
    store.publish_snapshots("replay", min_interval_s=3600, max_share=1.0)  # then none but the new run's
    print("published", flush=True)
    sys.stdin.readline()
    with store.transaction():  # as a replay makes its runs
        run_id = store.create_run("replay", "live", "target", "spec-ngram", "t", "c", {})
    print("created", run_id, flush=True)
    sys.stdin.readline()
    store.close()
""")


def test_summary_while_a_writer_has_not_stored_its_run_yet(tmp_path):
    db = tmp_path / "audit.duckdb"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(db)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert writer.stdout.readline().strip() == "published"
        early = invoke("summary", "--db", db)
        assert early.exit_code == 2, early.output
        assert f"no run stored yet; process {writer.pid} is writing a replay run" in early.output
        assert "first figures once its first chunk is stored" in early.output and "first;" not in early.output

        writer.stdin.write("go\n")
        writer.stdin.flush()
        run_id = int(writer.stdout.readline().split()[1])
        started = invoke("summary", "--db", db, "--json")  # the new run was published at once
        assert started.exit_code == 0, started.output
        assert (f"replay run {run_id} (live) is being written by process {writer.pid} and holds no calls yet: its "
                "first figures show once its first chunk is stored") in started.stderr
    finally:
        writer.stdin.close()
        writer.wait(timeout=60)


def test_a_matrix_whose_calls_were_all_cut_says_so_instead_of_failing(tmp_path):
    """A remedy matrix whose every answer stopped at max_tokens has nothing to put on a frontier: the finished
    replay says so in words and exits 0 (the run is stored and complete); `--json` still refuses (exit 1)."""
    from conftest import REPO
    from helpers import build_tiny_model, torch_path_toml

    model = build_tiny_model(tmp_path / "tiny")
    paths = tmp_path / "paths.toml"  # random weights never end an answer: every one is cut at max_tokens
    paths.write_text(torch_path_toml("base", model, max_tokens=2) + torch_path_toml("spec", model, max_tokens=2,
                                                                                   speculative=True)
                     + torch_path_toml("other", model, max_tokens=3))  # another decoding, not a noise floor
    db = str(tmp_path / "m.duckdb")
    made = CliRunner().invoke(cli, ["replay", str(REPO / "traces" / "demo.jsonl"), "--paths", str(paths),
                                    "--baseline", "base", "--candidate", "spec", "--candidate", "other",
                                    "--limit", "3", "--db", db])
    assert made.exit_code == 0, made.output
    assert "no frontier: run 1 has no matched calls" in made.output and "raise --max-tokens" in made.output
    as_json = CliRunner().invoke(cli, ["summary", "--db", db, "--json"])
    assert as_json.exit_code == 1 and "no matched calls" in as_json.output
