"""The fast validity path must never call valid what jsonschema calls invalid."""

from __future__ import annotations

import json
import random

from conftest import REPO
from jsonschema import Draft202012Validator

from toolaudit.validate.fastpath import compile_fast
from toolaudit.validate.schemas import normalize_schema

SCHEMA = {
    "type": "object",
    "properties": {
        "limit": {"type": "integer", "minimum": 1, "maximum": 500},
        "ratio": {"type": "number", "exclusiveMaximum": 1},
        "name": {"type": "string", "minLength": 2, "pattern": "^[a-z]+$"},
        "status": {"type": "array", "items": {"type": "string", "enum": ["open", "closed"]}, "maxItems": 2},
        "flag": {"type": ["boolean", "null"]},
        "nested": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                   "additionalProperties": False},
    },
    "required": ["limit"],
}
VALUES = [0, 1, 2, 5.0, 5.5, 499, 501, -1, True, False, None, "", "ab", "Ab", "abc", "open", "closed", "x",
          [], ["open"], ["open", "closed", "open"], ["x"], [1], {}, {"a": 1}, {"a": 1, "b": 2}, {"a": "1"},
          0.5, 1.0, 2**70]


def random_instance(rng: random.Random) -> dict:
    keys = ["limit", "ratio", "name", "status", "flag", "nested", "other"]
    inst = {k: rng.choice(VALUES) for k in rng.sample(keys, rng.randint(0, 3))}
    if rng.random() < 0.7:
        inst["limit"] = rng.choice([1, 2, 5.0, 499])
    return inst


def test_fast_path_agrees_with_jsonschema_on_random_instances():
    fast = compile_fast(SCHEMA)
    assert fast is not None
    validator = Draft202012Validator(SCHEMA)
    rng = random.Random(0)
    agree_valid = 0
    for _ in range(5000):
        inst = random_instance(rng)
        expected = validator.is_valid(inst)
        assert fast(inst) == expected, inst
        agree_valid += expected
    assert agree_valid > 50  # the sample exercised the valid side too


def test_out_of_subset_schemas_have_no_fast_path():
    assert compile_fast({"type": "object", "oneOf": [{"required": ["a"]}]}) is None
    assert compile_fast({"enum": [1, 2]}) is None
    assert compile_fast({"$ref": "#/defs/x"}) is None


def test_bfcl_and_demo_schemas_agree_on_recorded_arguments():
    demo = REPO / "traces" / "demo.jsonl"
    checked = 0
    for line in demo.read_text().splitlines():
        rec = json.loads(line)
        call = rec["response"]["choices"][0]["message"]["tool_calls"][0]["function"]
        schema_file = REPO / "schemas" / f"{call['name']}.json"
        schema = json.loads(schema_file.read_text())
        schema = schema.get("parameters", schema)
        schema, _ = normalize_schema(schema)
        args = json.loads(call["arguments"])
        fast = compile_fast(schema)
        if fast is None:
            continue
        validator = Draft202012Validator(schema)
        for variant in (args, {**args, "limit": "5"}, {}, {k: None for k in args}):
            assert fast(variant) == validator.is_valid(variant)
        checked += 1
    assert checked > 100
