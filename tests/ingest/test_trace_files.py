"""The committed trace files: format, byte-identical regeneration, the expected drifts, the demo's counts."""

from __future__ import annotations

import collections
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRACES = REPO / "traces"
SCHEMAS = REPO / "schemas"
SCRIPTS = REPO / "scripts"
LOGS = ["example_baseline.jsonl", "example_candidate.jsonl", "demo.jsonl"]
MB = 1024 * 1024


def load(name: str) -> list[dict]:
    with open(TRACES / name, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def by_key(records: list[dict]) -> dict[tuple[str, int], dict]:
    return {
        (r["request"]["metadata"]["session_id"], int(r["request"]["metadata"]["call_index"])): r
        for r in records
    }


def message(record: dict) -> dict:
    return record["response"]["choices"][0]["message"]


def calls(record: dict) -> list[tuple[str, object]]:
    """Canonical tool calls: (name, parsed arguments); key order and whitespace do not matter."""
    return [
        (tc["function"]["name"], json.loads(tc["function"]["arguments"]))
        for tc in message(record).get("tool_calls") or []
    ]


def same(a, b) -> bool:
    """Equal with JSON types kept apart (5 != "5", True != 1)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- format


@pytest.mark.parametrize("name", LOGS)
def test_log_is_chat_completions_jsonl(name):
    records = load(name)
    assert records
    keys = collections.Counter()
    for r in records:
        req, resp = r["request"], r["response"]
        assert set(r) == {"request", "response"}
        assert req["tool_choice"] == "auto" and req["temperature"] == 0 and req["model"]
        meta = req["metadata"]
        assert {"session_id", "customer", "call_index"} <= set(meta)
        assert all(isinstance(v, str) for v in meta.values())  # OpenAI metadata is a string map
        keys[(meta["session_id"], int(meta["call_index"]))] += 1

        assert req["messages"][0]["role"] == "system" and req["messages"][-1]["role"] == "user"
        seen_ids = set()
        for m in req["messages"]:
            assert m["role"] in {"system", "user", "assistant", "tool"}
            for tc in m.get("tool_calls") or []:
                assert tc["type"] == "function" and isinstance(tc["function"]["arguments"], str)
                json.loads(tc["function"]["arguments"])
                seen_ids.add(tc["id"])
            if m["role"] == "tool":
                assert m["tool_call_id"] in seen_ids  # results answer an earlier call of the same context
                json.loads(m["content"])
        for t in req["tools"]:
            assert t["type"] == "function"
            assert set(t["function"]) == {"name", "description", "parameters"}

        assert resp["id"].startswith("chatcmpl-") and resp["object"] == "chat.completion"
        assert isinstance(resp["created"], int) and resp["system_fingerprint"].startswith("fp_")
        choice = resp["choices"][0]
        assert choice["index"] == 0 and choice["message"]["role"] == "assistant"
        if choice["message"].get("tool_calls"):
            assert choice["finish_reason"] == "tool_calls"
            for tc in choice["message"]["tool_calls"]:
                assert tc["id"].startswith("call_") and tc["type"] == "function"
                assert isinstance(tc["function"]["arguments"], str)
        usage = resp["usage"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert max(keys.values()) == 1, "each (session_id, call_index) appears once"
    sessions = collections.defaultdict(list)
    for sid, i in keys:
        sessions[sid].append(i)
    assert all(sorted(v) == list(range(len(v))) for v in sessions.values())


@pytest.mark.parametrize(
    "name,limit",
    [("example_baseline.jsonl", 2 * MB), ("example_candidate.jsonl", 2 * MB), ("demo.jsonl", 1.5 * MB)],
)
def test_files_stay_small(name, limit):
    assert (TRACES / name).stat().st_size < limit


# ---------------------------------------------------------------- regeneration


def run_script(*args: str) -> None:
    subprocess.run([sys.executable, *args], check=True, capture_output=True, cwd=REPO)


def test_example_traces_regenerate_byte_identical(tmp_path):
    bfcl = load_script("make_example_traces").DEFAULT_BFCL
    if not (bfcl / "BFCL_v4_multiple.json").exists():
        pytest.skip(f"BFCL data not found at {bfcl} (set TOOLAUDIT_BFCL_DIR)")
    run_script(str(SCRIPTS / "make_example_traces.py"), "--out-dir", str(tmp_path))
    for name in ["example_baseline.jsonl", "example_candidate.jsonl", "example_expected.json"]:
        assert (tmp_path / name).read_bytes() == (TRACES / name).read_bytes(), name


def test_demo_traces_regenerate_byte_identical(tmp_path):
    run_script(
        str(SCRIPTS / "make_demo_traces.py"),
        "--out-dir",
        str(tmp_path),
        "--schemas-dir",
        str(tmp_path / "schemas"),
    )
    assert (tmp_path / "demo.jsonl").read_bytes() == (TRACES / "demo.jsonl").read_bytes()
    generated = sorted(p.name for p in (tmp_path / "schemas").iterdir())
    assert generated
    for name in generated:
        assert (tmp_path / "schemas" / name).read_bytes() == (SCHEMAS / name).read_bytes(), name


# ---------------------------------------------------------------- the expected drifts


@pytest.fixture(scope="module")
def example():
    expected = json.loads((TRACES / "example_expected.json").read_text(encoding="utf-8"))
    return by_key(load("example_baseline.jsonl")), by_key(load("example_candidate.jsonl")), expected


def get_path(args: dict, path: str):
    """`filters.status[0]` -> args["filters"]["status"][0]; KeyError if absent."""
    import re

    value = args
    for key, index in re.findall(r"\.?([^.\[\]]+)|\[(\d+)\]", path):
        value = value[int(index)] if index else value[key]
    return value


def normalise(schema):
    """BFCL types -> JSON Schema, the way the product normalises them (dict, float, tuple, any, optional)."""
    if isinstance(schema, list):
        return [normalise(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: v for k, v in schema.items() if k != "optional"}
    aliases = {"dict": "object", "float": "number", "tuple": "array"}
    if out.get("type") == "any":
        del out["type"]
    elif out.get("type") in aliases:
        out["type"] = aliases[out["type"]]
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: normalise(v) for k, v in out["properties"].items()}
    if "items" in out:
        out["items"] = normalise(out["items"])
    return out


def schema_valid(record: dict, name: str, args) -> bool:
    jsonschema = pytest.importorskip("jsonschema")
    tool = next(t for t in record["request"]["tools"] if t["function"]["name"] == name)
    return jsonschema.Draft202012Validator(normalise(tool["function"]["parameters"])).is_valid(args)


def test_expected_counts_and_customers(example):
    base, cand, expected = example
    counts = expected["counts"]
    assert counts["sessions_matched"] >= 100
    assert len(base) == counts["baseline_calls"] and len(cand) == counts["candidate_calls"]
    assert len(set(base) & set(cand)) == counts["calls_matched"]
    assert 15 <= len(expected["drifts"]) <= 20 and len(expected["reformatted"]) >= 15
    assert len(counts["customers"]) == 4 and len(set(counts["customers"].values())) == 4  # unequal traffic
    sizes = collections.Counter(sid for sid, _ in base)
    assert all(2 <= n <= 6 for sid, n in sizes.items())


def test_expected_drifts_really_differ(example):
    base, cand, expected = example
    kinds = collections.Counter()
    for d in expected["drifts"]:
        key = (d["session_id"], d["call_index"])
        assert key in base and key in cand, key
        b, c = base[key], cand[key]
        ((b_name, b_args),) = calls(b)
        assert d["tool"] == b_name
        kinds[d["kind"]] += 1
        if d["kind"] == "tool_name_changed":
            ((c_name, c_args),) = calls(c)
            assert (d["baseline"], d["candidate"]) == (b_name, c_name) and b_name != c_name
            assert c_name in {t["function"]["name"] for t in c["request"]["tools"]}
            assert same(b_args, c_args) and d["path"] is None
        elif d["kind"] == "call_count_changed":
            assert (d["baseline"], d["candidate"]) == (len(calls(b)), len(calls(c))) == (1, 2)
            assert same(calls(c)[0], calls(b)[0]) and d["path"] is None
        elif d["kind"] == "unparseable":
            assert not message(c).get("tool_calls") and message(c)["content"] == d["candidate"]
            with pytest.raises(ValueError):
                json.loads(d["candidate"].removeprefix("<tool_call>").removesuffix("</tool_call>"))
            assert d["path"] is None
        else:
            assert d["kind"] in {"arguments_changed", "schema_broken"}
            ((c_name, c_args),) = calls(c)
            assert c_name == b_name and not same(b_args, c_args)
            if d["arg_kind"] == "added":
                with pytest.raises((KeyError, IndexError)):
                    get_path(b_args, d["path"])
            else:
                assert same(get_path(b_args, d["path"]), d["baseline"])
            if d["arg_kind"] == "missing":
                with pytest.raises((KeyError, IndexError)):
                    get_path(c_args, d["path"])
            else:
                assert same(get_path(c_args, d["path"]), d["candidate"])
            assert not same(d["baseline"], d["candidate"])
            assert schema_valid(b, b_name, b_args)
            assert schema_valid(c, c_name, c_args) == (d["kind"] == "arguments_changed"), d
    assert set(kinds) == {
        "arguments_changed",
        "tool_name_changed",
        "call_count_changed",
        "unparseable",
        "schema_broken",
    }


def test_the_truncated_call_stopped_at_max_tokens(example):
    """The candidate answer cut at max_tokens: finish_reason length, an unfinished tool call; not a drift."""
    base, cand, expected = example
    assert len(expected["truncated"]) == expected["counts"]["truncated_calls"] == 1
    for t in expected["truncated"]:
        key = (t["session_id"], t["call_index"])
        assert key not in {(d["session_id"], d["call_index"]) for d in expected["drifts"]}
        choice = cand[key]["response"]["choices"][0]
        assert choice["finish_reason"] == "length" and choice["message"]["content"] == t["candidate"]
        assert base[key]["response"]["choices"][0]["finish_reason"] == "tool_calls"


def test_every_other_matched_call_is_the_same_after_canonicalisation(example):
    base, cand, expected = example
    drifted = {(d["session_id"], d["call_index"]) for d in expected["drifts"] + expected["truncated"]}
    reformatted = {(r["session_id"], r["call_index"]) for r in expected["reformatted"]}
    text_only = {(t["session_id"], t["call_index"]) for t in expected["text_only"]}
    for key in set(base) & set(cand):
        b, c = base[key], cand[key]
        assert b["request"] == c["request"], "both paths answered the same request"
        if key in drifted:
            continue
        assert same(calls(b), calls(c)), key
        raw_b = [tc["function"]["arguments"] for tc in message(b)["tool_calls"]]
        raw_c = [tc["function"]["arguments"] for tc in message(c)["tool_calls"]]
        if key in reformatted:
            assert b["response"]["id"] != c["response"]["id"]
            assert b["response"]["system_fingerprint"] != c["response"]["system_fingerprint"]
            assert message(b)["tool_calls"][0]["id"] != message(c)["tool_calls"][0]["id"]
            assert raw_b != raw_c
        elif key in text_only:
            assert message(b)["content"] != message(c)["content"]
        else:
            assert b["response"] == c["response"], key
    for t in expected["text_only"]:
        key = (t["session_id"], t["call_index"])
        assert (message(base[key])["content"], message(cand[key])["content"]) == (
            t["baseline"],
            t["candidate"],
        )


def test_unmatched_sessions_appear_in_one_log_only(example):
    base, cand, expected = example
    base_sessions, cand_sessions = {s for s, _ in base}, {s for s, _ in cand}
    assert sorted(base_sessions - cand_sessions) == sorted(expected["unmatched"]["baseline_only"])
    assert sorted(cand_sessions - base_sessions) == sorted(expected["unmatched"]["candidate_only"])
    assert (
        len(expected["unmatched"]["baseline_only"]) == 2 and len(expected["unmatched"]["candidate_only"]) == 1
    )


# ---------------------------------------------------------------- the demo


def test_demo_counts():
    records = load("demo.jsonl")
    sessions = collections.Counter(r["request"]["metadata"]["session_id"] for r in records)
    customers = {r["request"]["metadata"]["customer"] for r in records}
    tools = {name for r in records for name, _ in calls(r)}
    assert len(sessions) >= 60 and all(3 <= n <= 5 for n in sessions.values())
    assert len(customers) >= 3 and len(tools) >= 6
    assert all(2 <= len(r["request"]["tools"]) <= 4 for r in records)
    assert all(len(calls(r)) == 1 for r in records)


def test_demo_sample_is_60_sessions_of_2_calls_from_every_customer():
    """`toolaudit demo` replays the first 2 calls of the first 60 sessions: its documented 120 calls."""
    from toolaudit.replay.demo import DEMO_CALLS, DEMO_CALLS_PER_SESSION, DEMO_TRACES
    from toolaudit.replay.inputs import ReplayOptions, load_calls

    sample, errors, _ = load_calls(ReplayOptions(traces=[str(DEMO_TRACES)], limit=DEMO_CALLS,
                                                 calls_per_session=DEMO_CALLS_PER_SESSION))
    sessions = collections.Counter(c.session_id for c in sample)
    assert not errors and len(sample) == 120
    assert len(sessions) == 60 and set(sessions.values()) == {2}
    assert len({c.customer for c in sample}) >= 3


def test_demo_prompts_stay_compact():
    demo = load_script("make_demo_traces")
    assert all(demo.prompt_chars(r["request"]) <= demo.PROMPT_CHAR_BUDGET for r in load("demo.jsonl"))


def test_demo_schema_files_are_valid_2020_12():
    jsonschema = pytest.importorskip("jsonschema")
    offered = {t["function"]["name"] for r in load("demo.jsonl") for t in r["request"]["tools"]}
    for name in offered:
        schema = json.loads((SCHEMAS / f"{name}.json").read_text(encoding="utf-8"))
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        jsonschema.Draft202012Validator.check_schema(schema)


def test_demo_responses_validate_against_their_schema_files():
    jsonschema = pytest.importorskip("jsonschema")
    validators = {}
    for r in load("demo.jsonl"):
        for name, args in calls(r):
            if name not in validators:
                schema = json.loads((SCHEMAS / f"{name}.json").read_text(encoding="utf-8"))
                validators[name] = jsonschema.Draft202012Validator(
                    schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
                )
            errors = [e.message for e in validators[name].iter_errors(args)]
            assert not errors, (name, args, errors)


def test_demo_schema_names_do_not_shadow_example_tools():
    """schemas/<name>.json applies to every trace calling <name>: it must not capture a BFCL tool."""
    demo_names = {p.stem for p in SCHEMAS.glob("*.json")}
    example_names = {
        t["function"]["name"] for name in LOGS[:2] for r in load(name) for t in r["request"]["tools"]
    }
    assert not demo_names & example_names
