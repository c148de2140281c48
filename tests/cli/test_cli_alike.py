"""A CLI that reads alike: --run takes an id or a name everywhere, --format always means the trace format, every
command's --help has an example, JSON values print as JSON, OpenAI logs written as a JSON array or pretty-printed
are read, and the same error exits with the same code in every command."""

from __future__ import annotations

import csv
import io
import json
import shlex
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from conftest import REPO, line, tool_call, write_jsonl

from toolaudit.cli import cli
from toolaudit.cli.common import TraceFormatName
from toolaudit.store import Store


def _logs(tmp_path: Path, drifted: int = 1, n: int = 6, tag: str = "") -> tuple[Path, Path]:
    """n calls on two customers, the first `drifted` of them with another `limit` on the candidate."""
    b = [line(session=f"s{i}", customer=["acme", "globex"][i % 2],
              calls=[tool_call("search_tickets", {"query": "q", "limit": 5})]) for i in range(n)]
    c = [line(session=f"s{i}", customer=["acme", "globex"][i % 2],
              calls=[tool_call("search_tickets", {"query": "q", "limit": 50 if i < drifted else 5})])
         for i in range(n)]
    return write_jsonl(tmp_path / f"b{tag}.jsonl", b), write_jsonl(tmp_path / f"c{tag}.jsonl", c)


def _invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


@pytest.fixture
def named_db(tmp_path, db_path) -> str:
    """Runs 1 and 3 named `nightly` (1 and 2 drifted calls), run 2 named `adhoc` (3)."""
    for k, (drifted, name) in enumerate([(1, "nightly"), (3, "adhoc"), (2, "nightly")]):
        b, c = _logs(tmp_path, drifted, tag=str(k))
        result = _invoke("compare", str(b), str(c), "--db", str(db_path), "--run-name", name)
        assert result.exit_code == 0, result.output
    return str(db_path)


# -- 1. --run ID|NAME ------------------------------------------------------------------------------------------------
def test_summary_takes_a_run_name_and_picks_the_newest_of_several(named_db):
    result = _invoke("summary", "--run", "nightly", "--db", named_db, "--json")
    assert result.exit_code == 0, result.output
    s = json.loads(result.stdout)
    assert (s["run_id"], s["drifted_calls"]) == (3, 2)
    assert "2 runs are named 'nightly' (runs 1, 3); using the newest, run 3" in result.stderr
    one = _invoke("summary", "--run", "adhoc", "--db", named_db, "--json")
    assert json.loads(one.stdout)["run_id"] == 2 and one.stderr == ""  # one run of that name: nothing to say
    by_id = _invoke("summary", "--run", "1", "--db", named_db, "--json")
    assert json.loads(by_id.stdout)["drifted_calls"] == 1


@pytest.mark.parametrize("args", [
    ["summary"], ["frontier"], ["report", "--all-customers", "--write", "json", "-o", "{tmp}/r"],
    ["check", "--max-call-drift", "99%"], ["export", "-o", "{tmp}/x"],
])
def test_every_run_option_takes_a_name(named_db, tmp_path, args):
    args = [a.format(tmp=tmp_path) for a in args]
    result = _invoke(*args, "--run", "adhoc", "--db", named_db)
    assert result.exit_code == 0, result.output
    unknown = _invoke(*args, "--run", "nigthly", "--db", named_db)
    assert unknown.exit_code == 2, unknown.output
    assert "no run named 'nigthly' (runs: nightly, adhoc; see `toolaudit runs`)" in unknown.output
    assert _invoke(*args, "--run", "99", "--db", named_db).exit_code == 2


def test_report_and_export_by_name_use_that_run(named_db, tmp_path):
    out = tmp_path / "r"
    assert _invoke("report", "--run", "adhoc", "--customer", "acme", "--write", "json", "-o", str(out),
                   "--db", named_db).exit_code == 0
    assert [p.parent.name for p in out.rglob("*.json")] == ["run-2"]
    assert _invoke("export", "--run", "adhoc", "--as", "csv", "-o", str(tmp_path / "x"),
                   "--db", named_db).exit_code == 0
    with (tmp_path / "x" / "calls.csv").open() as fh:
        assert {r["run_id"] for r in csv.DictReader(fh)} == {"2"}


def test_check_against_a_name_is_the_newest_run_of_that_name_before_the_one_checked(named_db):
    result = _invoke("check", "--run", "nightly", "--against", "nightly", "--max-increase", "50pp",
                     "--db", named_db, "--json")
    assert result.exit_code == 0, result.output
    checks = json.loads(result.stdout)["runs"][0]["checks"]
    increase = next(c for c in checks if c["name"] == "increase")
    assert increase["against"] == 1 and increase["before"]["drifted_calls"] == 1  # run 3 against run 1
    first = _invoke("check", "--run", "1", "--against", "nightly", "--max-increase", "1pp", "--db", named_db)
    assert first.exit_code == 2 and "no run named 'nightly' before run 1" in first.output


def test_a_name_made_of_digits_is_an_id_first(tmp_path, db_path):
    b, c = _logs(tmp_path)
    _invoke("compare", str(b), str(c), "--db", str(db_path), "--run-name", "2024")
    _invoke("compare", str(b), str(c), "--db", str(db_path), "--run-name", "1")
    assert json.loads(_invoke("summary", "--run", "2024", "--db", str(db_path), "--json").stdout)["run_id"] == 1
    assert json.loads(_invoke("summary", "--run", "1", "--db", str(db_path), "--json").stdout)["run_id"] == 1


# -- 2. --format means the trace format ------------------------------------------------------------------------------
def _commands(group: click.Group = cli, path: tuple[str, ...] = ()):
    for name, command in group.commands.items():
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))


def test_format_is_the_trace_format_wherever_it_is_shown():
    shown = []
    for path, command in _commands():
        for param in command.params:
            if "--format" in getattr(param, "opts", []) and not param.hidden:
                assert isinstance(param.type, TraceFormatName), path
                shown.append(" ".join(path))
    assert {"compare", "replay", "import", "batch export"} <= set(shown)


def test_report_writes_files_with_write_and_prints_as_and_old_spellings_warn(named_db, tmp_path):
    new = _invoke("report", "--run", "1", "--all-customers", "--write", "md", "-o", str(tmp_path / "a"), "--db",
                  named_db)
    assert new.exit_code == 0 and new.stderr == "", new.output
    assert {p.suffix for p in (tmp_path / "a").rglob("*.*")} == {".md"}
    printed = _invoke("report", "--run", "1", "--all-customers", "--write", "md", "--as", "json", "-o",
                      str(tmp_path / "c"), "--db", named_db)
    assert printed.exit_code == 0 and printed.stderr == "", printed.output
    assert {Path(f).suffix for f in json.loads(printed.stdout)["files"]} == {".md"}
    for old_spelling, warned in ((["--format", "md"], "`report --format` is deprecated"),
                                 (["--as", "md"], "`report --as md` names files to write")):
        old = _invoke("report", "--run", "1", "--all-customers", *old_spelling, "-o", str(tmp_path / "b"), "--json",
                      "--db", named_db)
        assert old.exit_code == 0, old.output
        assert warned in old.stderr and "--write" in old.stderr
        assert {Path(f).suffix for f in json.loads(old.stdout)["files"]} == {".md"}  # stdout stays JSON
    exported = _invoke("export", "--format", "csv", "-o", str(tmp_path / "x"), "--db", named_db)
    assert exported.exit_code == 0 and "`export --format` is deprecated" in exported.stderr
    assert (tmp_path / "x" / "calls.csv").exists()
    assert _invoke("export", "--format", "xlsx", "-o", str(tmp_path / "y"), "--db", named_db).exit_code == 2


def test_as_is_the_output_format_of_query_commands_and_json_its_shortcut(named_db):
    as_json = _invoke("summary", "--as", "json", "--db", named_db)
    assert json.loads(as_json.stdout) == json.loads(_invoke("summary", "--json", "--db", named_db).stdout)
    as_csv = _invoke("runs", "--as", "csv", "--db", named_db)
    assert as_csv.stdout.splitlines()[0].startswith("run_id,name,kind")
    clash = _invoke("runs", "--json", "--as", "csv", "--db", named_db)
    assert clash.exit_code == 2 and "cannot be used together" in clash.output


# -- 3. an example in every --help ----------------------------------------------------------------------------------
def test_every_command_help_ends_with_an_example_that_parses(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for path, command in [((), cli), *_commands()]:
        help_text = CliRunner().invoke(cli, [*path, "--help"]).output
        assert "Example" in help_text, path
        examples = [ln.strip() for ln in command.epilog.splitlines() if ln.strip().startswith("toolaudit ")]
        assert examples, path
        for example in examples:
            assert example in help_text, (path, example)  # shown as written, not rewrapped
            words = shlex.split(example)[1:]
            target, name = cli, "toolaudit"
            while isinstance(target, click.Group):  # down to the command the example runs
                name, words = words[0], words[1:]
                target = target.commands[name]
            if path and isinstance(command, click.Group):
                assert path[0] in example, (path, example)
            for word in words:  # files the example names, for options that want them to exist
                if word.endswith((".jsonl", ".json")):
                    Path(word).parent.mkdir(parents=True, exist_ok=True)
                    Path(word).touch()
            target.make_context(name, list(words))  # raises on an unknown option or a bad value


# -- 4. JSON values print as JSON ------------------------------------------------------------------------------------
def test_sql_prints_json_values_as_json_in_tables_and_csv(named_db):
    query = "SELECT true AS t, false AS f, [1, 2] AS l, {'a': NULL, 'b': 'x'} AS s, NULL AS n, 'text' AS v"
    table = _invoke("sql", query, "--db", named_db).stdout
    row = table.splitlines()[2].split()
    assert row == ["true", "false", "[1,2]", '{"a":null,"b":"x"}', "text"]  # NULL: an empty cell
    assert "None" not in table and "True" not in table
    rows = list(csv.reader(io.StringIO(_invoke("sql", query, "--db", named_db, "--csv").stdout)))
    assert rows[1] == ["true", "false", "[1,2]", '{"a":null,"b":"x"}', "", "text"]


def test_worst_example_prints_argument_values_as_json(tmp_path, db_path):
    b = [line(session="s0", calls=[tool_call("search_tickets", {"query": "q", "limit": 5})])]
    c = [line(session="s0", calls=[tool_call("search_tickets", {"query": "q", "limit": None,
                                                                "filters": {"status": ["open"]}})])]
    result = _invoke("compare", str(write_jsonl(tmp_path / "b.jsonl", b)), str(write_jsonl(tmp_path / "c.jsonl", c)),
                     "--db", str(db_path))
    assert '  filters: (absent) -> {"status":["open"]} (added)' in result.stdout
    assert "  limit: 5 -> null (type_changed)" in result.stdout
    assert "None" not in result.stdout


# -- 5. OpenAI logs as one JSON array, or pretty-printed ---------------------------------------------------------------
def _records(n: int = 3) -> list[dict]:
    return [line(session=f"s{i}", calls=[tool_call("search_tickets", {"query": "q", "limit": i + 1})])
            for i in range(n)]


@pytest.mark.parametrize("write", [
    lambda path, recs: path.write_text(json.dumps(recs)),  # one line
    lambda path, recs: path.write_text(json.dumps(recs, indent=2)),  # json.dump(..., indent=2)
    lambda path, recs: path.write_text("\n".join(json.dumps(r, indent=2) for r in recs)),  # jq . of a log
], ids=["array", "pretty-array", "pretty-records"])
def test_openai_log_as_a_json_array_or_pretty_printed_is_read(tmp_path, db_path, write):
    base = write_jsonl(tmp_path / "b.jsonl", _records())
    cand = tmp_path / "c.json"
    write(cand, _records())
    result = _invoke("compare", str(base), str(cand), "--db", str(db_path), "--json")
    assert result.exit_code == 0, result.output
    s = json.loads(result.stdout)
    assert (s["calls"], s["drifted_calls"], s["error_rows"]) == (3, 0, 0)
    imported = _invoke("import", str(cand), "-o", str(tmp_path / "out.jsonl"))
    assert imported.exit_code == 0 and "(openai, detected): 3 calls" in imported.stderr
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 3


def test_bad_records_of_an_array_name_the_file_line_and_record(tmp_path, db_path):
    recs = _records()
    cand = tmp_path / "c.json"
    cand.write_text(json.dumps(recs[:2] + [{"request": {"messages": "hi"}, "response": {}}, 7] + recs[2:], indent=2))
    result = _invoke("compare", str(write_jsonl(tmp_path / "b.jsonl", recs)), str(cand), "--db", str(db_path))
    assert result.exit_code == 0, result.output
    text = cand.read_text().splitlines()
    with Store(db_path, read_only=True) as store:
        errors = store.rows("SELECT source, line, field, message FROM trace_errors ORDER BY line")
    assert [(Path(e["source"]).name, e["field"], e["message"]) for e in errors] == [
        ("c.json", "request.messages", "must be a list, got a str (record 3)"),
        ("c.json", None, "must be a JSON object, got int (record 4)")]
    assert text[errors[0]["line"] - 1].strip() == "{" and text[errors[0]["line"]].strip() == '"request": {'
    assert text[errors[1]["line"] - 1].strip() == "7,"


def test_a_json_array_a_format_cannot_read_names_the_file_and_the_one_line_fix(tmp_path):
    record = {"request": {"model": "m", "input": "hi", "metadata": {"session_id": "s1"}},
              "response": {"object": "response", "output": []}}
    arr = tmp_path / "responses.json"
    arr.write_text(json.dumps([record, record], indent=2))
    result = _invoke("import", str(arr), "-o", str(tmp_path / "out.jsonl"))
    assert result.exit_code == 1
    assert f"{arr}: no usable calls" in result.output and "Read as responses (detected" in result.output
    assert f"jq -c '.[]' {arr} > {tmp_path / 'responses.jsonl'}" in result.output


def test_a_log_whose_first_line_is_a_broken_record_is_still_read_line_by_line(tmp_path, db_path):
    recs = _records()
    cand = write_jsonl(tmp_path / "c.jsonl", [b"{", *recs])
    result = _invoke("compare", str(write_jsonl(tmp_path / "b.jsonl", recs)), str(cand), "--db", str(db_path),
                     "--json")
    s = json.loads(result.stdout)
    assert (s["calls"], s["error_rows"]) == (3, 1) and s["first_errors"][0]["line"] == 1


# -- 6. one exit code per error ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("args", [
    ["summary"], ["runs"], ["frontier"], ["report", "--all-customers", "-o", "{tmp}/r"],
    ["check", "--max-call-drift", "1%"], ["export", "-o", "{tmp}/x"], ["sql", "SELECT 1"],
])
def test_no_database_and_no_run_exit_2_in_every_command(tmp_path, db_path, args):
    args = [a.format(tmp=tmp_path) for a in args]
    missing = _invoke(*args, "--db", str(tmp_path / "none.duckdb"))
    assert missing.exit_code == 2 and "no such database" in missing.output, missing.output
    if args[0] in ("runs", "sql"):
        return
    with Store(db_path):
        pass  # a database holding no run
    if args[0] != "export":  # (export's default is every run: an empty database exports empty tables)
        empty = _invoke(*args, "--db", str(db_path))
        assert empty.exit_code == 2 and "no runs yet" in empty.output, empty.output
    assert _invoke(*args, "--run", "7", "--db", str(db_path)).exit_code == 2
    assert _invoke(*args, "--no-such-option", "--db", str(db_path)).exit_code == 2


def test_merge_of_a_missing_run_exits_2(named_db, tmp_path):
    result = _invoke("merge", f"{named_db}@9", "--db", str(tmp_path / "m.duckdb"))
    assert result.exit_code == 2 and "no run with id 9" in result.output


def test_exit_codes_are_documented_in_one_place():
    text = (REPO / "docs" / "reliability.md").read_text()
    section = text[text.index("## Exit codes"):]
    for code in ("`0`", "`1`", "`2`", "`130`", "`143`"):
        assert code in section, code
    assert "docs/reliability.md#exit-codes" in (REPO / "README.md").read_text()
