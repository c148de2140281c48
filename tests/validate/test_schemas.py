"""Schema normalisation (real BFCL schemas), the override-file registry, and validation messages."""

from __future__ import annotations

import copy
import json
from itertools import islice
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from toolaudit import TraceError
from toolaudit.validate.schemas import SchemaRegistry, normalize_schema, tool_schemas_from_request

BFCL = Path("/work/shared/data/bfcl/BFCL_v4_multiple.json")

SEARCH = {
    "type": "object",
    "properties": {
        "query": {"type": "string"},
        "limit": {"type": "integer"},
        "filters": {
            "type": "object",
            "properties": {"status": {"type": "array", "items": {"enum": ["open", "closed"]}}},
        },
    },
    "required": ["query"],
}


def _bfcl_functions(lines: int | None = None) -> list[dict]:
    if not BFCL.exists():
        pytest.skip("BFCL data not available")
    with BFCL.open() as f:
        return [fn for line in islice(f, lines) for fn in json.loads(line)["function"]]


def _types(schema) -> set:
    """Every `type` value in a schema, walking all nested dicts and lists."""
    if isinstance(schema, list):
        return set().union(*map(_types, schema)) if schema else set()
    if not isinstance(schema, dict):
        return set()
    found = {schema["type"]} if isinstance(schema.get("type"), str) else set()
    return found.union(*(_types(v) for k, v in schema.items() if k not in ("enum", "default")))


# --- normalisation ---------------------------------------------------------------------------------------


def test_every_bfcl_schema_normalises_to_valid_json_schema():
    functions = _bfcl_functions()
    assert len(functions) > 100
    for fn in functions:
        original = copy.deepcopy(fn["parameters"])
        schema, _ = normalize_schema(fn["parameters"])
        Draft202012Validator.check_schema(schema)
        assert fn["parameters"] == original  # input untouched
        assert _types(schema) <= {"object", "array", "string", "number", "integer", "boolean", "null"}


def test_bfcl_first_line_warnings_and_result():
    triangle = _bfcl_functions(1)[0]
    assert triangle["name"] == "triangle_properties.get"
    schema, warnings = normalize_schema(triangle["parameters"])
    assert schema["type"] == "object"
    assert schema["required"] == ["side1", "side2", "side3"]
    assert "optional" not in schema["properties"]["get_area"]
    assert "parameters: type 'dict' normalised to 'object'" in warnings
    assert "parameters.properties.get_area: 'optional: true' flag removed" in warnings
    circle, circle_warnings = normalize_schema(_bfcl_functions(1)[1]["parameters"])
    assert circle["properties"]["radius"]["type"] == "number"
    assert "parameters.properties.radius: type 'float' normalised to 'number'" in circle_warnings


def test_normalise_all_variants_recursively():
    raw = {
        "type": "dict",
        "properties": {
            "point": {"type": "tuple", "items": {"type": "Float"}},
            "name": {"type": "String"},
            "flag": {"type": "Boolean", "optional": True},
            "extra": {"type": "any"},
            "tags": {
                "type": "array",
                "items": {
                    "anyOf": [{"type": "str"}, {"type": "dict", "additionalProperties": {"type": "int"}}]
                },
            },
            "either": {"type": ["String", "null"]},
        },
        "required": ["point", "flag", "extra"],
    }
    snapshot = copy.deepcopy(raw)
    schema, warnings = normalize_schema(raw)
    assert raw == snapshot
    props = schema["properties"]
    assert schema["type"] == "object"
    assert props["point"] == {"type": "array", "items": {"type": "number"}}
    assert props["name"] == {"type": "string"} and props["flag"] == {"type": "boolean"}
    assert props["extra"] == {}
    assert props["tags"]["items"]["anyOf"] == [
        {"type": "string"},
        {"type": "object", "additionalProperties": {"type": "integer"}},
    ]
    assert props["either"] == {"type": ["string", "null"]}
    assert schema["required"] == ["point", "extra"]
    assert (
        "parameters.properties.tags.items.anyOf[1].additionalProperties: type 'int' normalised to 'integer'"
        in warnings
    )
    assert "parameters.properties.extra: type 'any' dropped (no type constraint)" in warnings
    assert "parameters.required: optional ['flag'] removed" in warnings
    Draft202012Validator.check_schema(schema)


def test_bfcl_string_true_and_object_level_optional_lists():
    schema, _ = normalize_schema(
        {
            "type": "dict",
            "properties": {"a": {"type": "string", "optional": "True"}, "w": {"type": "float"}},
            "required": ["a", "w"],
            "optional": ["w"],
        }
    )
    assert schema["required"] == [] and "optional" not in schema


def test_valid_json_schema_is_unchanged():
    schema, warnings = normalize_schema(SEARCH)
    assert schema == SEARCH and warnings == []


# --- registry --------------------------------------------------------------------------------------------


def test_request_schema_is_compiled_once_and_cached():
    registry = SchemaRegistry()
    first = registry.get("search", SEARCH)
    assert first is registry.get("search", copy.deepcopy(SEARCH))  # equal content, different object
    assert first is registry.get("search", dict(reversed(list(SEARCH.items()))))  # key order does not matter
    assert first.source == "request" and first.invalid_reason is None
    other = registry.get("search", {**SEARCH, "required": ["query", "limit"]})
    assert other is not first


def test_no_schema_anywhere_gives_none(tmp_path):
    assert SchemaRegistry().get("search", None) is None
    assert SchemaRegistry(tmp_path).get("search", None) is None


def test_validation_messages_name_the_argument_path():
    compiled = SchemaRegistry().get("search", SEARCH)
    assert compiled.errors({"query": "x", "limit": 5}) == []
    assert compiled.errors({"query": "x", "limit": "abc"}) == ["limit: 'abc' is not of type 'integer'"]
    errors = compiled.errors({"limit": 5, "filters": {"status": ["open", "pending"]}})
    assert errors == [
        "'query' is a required property",
        "filters.status[1]: 'pending' is not one of ['open', 'closed']",
    ]


def test_errors_memo_returns_fresh_lists_and_keeps_nan_apart_from_null():
    compiled = SchemaRegistry().get("f", {"type": "object", "properties": {"x": {"type": "number"}}})
    first = compiled.errors({"x": "a"})
    first.append("mutated")
    assert compiled.errors({"x": "a"}) == ["x: 'a' is not of type 'number'"]
    assert compiled.errors({"x": None}) == ["x: None is not of type 'number'"]
    assert (
        compiled.errors({"x": float("nan")}) == []
    )  # NaN is a float; the NaN itself is flagged by toolcalls


def test_bfcl_schema_validates_after_normalisation():
    circle = _bfcl_functions(1)[1]
    compiled = SchemaRegistry().get(circle["name"], circle["parameters"])
    assert compiled.invalid_reason is None and compiled.warnings
    assert compiled.errors({"radius": 2}) == []  # an int is accepted for a BFCL float
    assert compiled.errors({"radius": "2"}) == ["radius: '2' is not of type 'number'"]


def test_invalid_schema_is_reported_not_raised():
    compiled = SchemaRegistry().get("search", {"type": "object", "properties": {"q": {"type": "strng"}}})
    assert compiled.invalid_reason is not None and "properties.q.type" in compiled.invalid_reason
    assert "strng" in compiled.invalid_reason
    assert compiled.errors({"q": "x"}) is None


def test_schema_dialect_from_dollar_schema():
    draft7 = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"p": {"type": "array", "items": [{"type": "integer"}, {"type": "string"}]}},
    }
    compiled = SchemaRegistry().get("t", draft7)
    assert compiled.invalid_reason is None  # array-form items is valid in draft 7, not in 2020-12
    assert compiled.errors({"p": [1, 2]}) == ["p[1]: 2 is not of type 'string'"]


@pytest.mark.parametrize("layout", ["bare", "openai", "named"])
def test_override_file_wins_over_request(tmp_path, layout):
    strict = {**SEARCH, "additionalProperties": False, "required": ["query", "limit"]}
    doc = {
        "bare": strict,
        "openai": {"type": "function", "function": {"name": "math.search", "parameters": strict}},
        "named": {"name": "math.search", "parameters": strict},
    }[layout]
    path = tmp_path / "math.search.json"  # dotted BFCL-style name, verbatim
    path.write_text(json.dumps(doc))
    registry = SchemaRegistry(tmp_path)
    compiled = registry.get("math.search", SEARCH)
    assert compiled.source == f"file:{path}"
    assert compiled.schema == strict
    assert compiled.errors({"query": "x", "extra": 1}) == [
        "'limit' is a required property",
        "Additional properties are not allowed ('extra' was unexpected)",
    ]
    assert registry.get("math.search", None) is compiled  # the file alone suffices, and is compiled once
    assert registry.get("other", SEARCH).source == "request"


def test_override_file_is_read_once(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"type": "object"}))
    registry = SchemaRegistry(tmp_path)
    first = registry.get("t", None)
    path.write_text("not json any more")
    assert registry.get("t", None) is first


def test_schema_file_that_is_not_json_names_file_and_line(tmp_path):
    path = tmp_path / "search.json"
    path.write_text('{\n  "type": "object",\n  "properties": {\n    "q": {"type": "string"},\n  }\n}\n')
    with pytest.raises(TraceError) as info:
        SchemaRegistry(tmp_path).get("search", SEARCH)
    assert info.value.path == str(path) and info.value.line == 4  # the line with the trailing comma
    assert str(info.value) == f"{path}:4: schema file is not valid JSON: trailing comma is not allowed"


def test_schema_file_not_an_object(tmp_path):
    (tmp_path / "t.json").write_text("[1, 2]")
    with pytest.raises(TraceError, match="must hold a JSON object"):
        SchemaRegistry(tmp_path).get("t", None)


@pytest.mark.parametrize("name", ["../escape", "a/b", "..", "x" * 400])
def test_hostile_tool_names_never_read_outside_the_directory(tmp_path, name):
    (tmp_path / "escape.json").write_text("not json")
    schema_dir = tmp_path / "schemas"
    schema_dir.mkdir()
    assert SchemaRegistry(schema_dir).get(name, None) is None


# --- request tools ---------------------------------------------------------------------------------------


def test_tool_schemas_from_request_tolerates_malformed_entries():
    tools = [
        {"type": "function", "function": {"name": "search", "description": "d", "parameters": SEARCH}},
        "garbage",
        {"type": "function", "function": {"description": "no name"}},
        {"type": "function", "name": "flat", "parameters": {"type": "object"}},  # Responses API shape
        {"type": "function", "function": {"name": "noargs"}},
        {"type": "function", "function": {"name": "bad", "parameters": "object"}},
        {"type": "function", "function": {"name": "search", "parameters": {}}},
    ]
    schemas, problems = tool_schemas_from_request(tools)
    assert schemas == {"search": SEARCH, "flat": {"type": "object"}, "noargs": None, "bad": None}
    assert problems == [
        "tools[1] is not an object",
        "tools[2] has no string name",
        "tools[5] (bad): parameters is not an object",
        "tools[6] (search): duplicate tool name, first definition kept",
    ]


@pytest.mark.parametrize(
    ("tools", "problems"), [(None, []), ([], []), ("x", ["tools is not a list (got str)"])]
)
def test_tool_schemas_from_request_odd_containers(tools, problems):
    assert tool_schemas_from_request(tools) == ({}, problems)
