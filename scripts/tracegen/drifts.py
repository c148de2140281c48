"""The drifts injected into the example candidate log, each with the entry the expected-drifts file records.

A recipe looks at one call and returns `(expected entry, edit)`, or None when the call does not fit (no
numeric argument to change, one tool offered...). The edit is new arguments (a dict), or `("rename", tool)`,
`("extra", call)`, `("text", raw, style)`; `apply_drift` writes it into the candidate's response. `RECIPES`
lists one recipe per injected drift: 20 drifts covering changed, retyped, missing, added and nested
arguments, a renamed tool, an extra call and unparseable text.
"""

from __future__ import annotations

import copy
import json
import re

from .bfcl_schema import is_valid
from .chat import rand_id, tool_call, usage
from .files import dumps


def append_digit(rng, v):
    if isinstance(v, float):
        return float(repr(v) + str(rng.randint(1, 9))) if "e" not in repr(v) else v * 10
    return int(str(v) + str(rng.randint(0, 9)))


def change_string(rng, s: str) -> str:
    options = [s + "s", s[:-1] if len(s) > 3 else s + "x"]
    if s[0].isalpha() and any(ch.islower() for ch in s[1:]):  # "Clippers" -> "clippers", not "nVDA"
        options.append((s[0].lower() if s[0].isupper() else s[0].upper()) + s[1:])
    new = rng.choice(options)
    return new if new != s else s + "_"


def props_of(call):
    return call["fns"][call["answer"]["name"]]["parameters"].get("properties", {})


def schema_of(call):
    return call["fns"][call["answer"]["name"]]["parameters"]


def kind_for(call, new_args):
    """The kind toolaudit should report: the BFCL schema decides between a value change and a broken call."""
    return "schema_broken" if not is_valid(new_args, schema_of(call)) else "arguments_changed"


def drift_entry(call, kind, path, baseline, candidate, arg_kind=None):
    return {
        "session_id": call["session_id"],
        "call_index": call["call_index"],
        "kind": kind,
        "arg_kind": arg_kind,
        "tool": call["answer"]["name"],
        "path": path,
        "baseline": baseline,
        "candidate": candidate,
    }


def r_number(rng, call):
    args, props = call["answer"]["args"], props_of(call)
    keys = [
        k
        for k, v in args.items()
        if isinstance(v, (int, float))
        and not isinstance(v, bool)
        and props.get(k, {}).get("type") in ("integer", "float", "number")
    ]
    if not keys:
        return None
    k = rng.choice(keys)
    new = dict(args, **{k: append_digit(rng, args[k])})
    if new[k] == args[k] or not is_valid(new, schema_of(call)):
        return None
    return drift_entry(call, "arguments_changed", k, args[k], new[k], "value_changed"), new


def r_string(rng, call):
    args, props = call["answer"]["args"], props_of(call)
    keys = [
        k for k, v in args.items() if isinstance(v, str) and len(v) > 1 and "enum" not in props.get(k, {})
    ]
    if not keys:
        return None
    k = rng.choice(keys)
    new = dict(args, **{k: change_string(rng, args[k])})
    return drift_entry(call, kind_for(call, new), k, args[k], new[k], "value_changed"), new


def r_type(rng, call):
    args, props = call["answer"]["args"], props_of(call)
    keys = [
        k for k, v in args.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and k in props
    ]
    if not keys:
        return None
    k = rng.choice(keys)
    new = dict(args, **{k: str(args[k])})
    return drift_entry(call, kind_for(call, new), k, args[k], new[k], "type_changed"), new


def r_missing(required: bool):
    def recipe(rng, call):
        args, req = call["answer"]["args"], set(schema_of(call).get("required", []))
        keys = [k for k in args if (k in req) == required]
        if len(args) < 2 or not keys:
            return None
        k = rng.choice(keys)
        new = {a: v for a, v in args.items() if a != k}
        return drift_entry(call, kind_for(call, new), k, args[k], None, "missing"), new

    return recipe


def r_added(rng, call):
    args, props = call["answer"]["args"], props_of(call)
    keys = [
        k
        for k, p in props.items()
        if k not in args and ("enum" in p or p.get("type") in ("integer", "boolean"))
    ]
    if not keys:
        return None
    k = rng.choice(keys)
    p = props[k]
    if "enum" in p:
        value = next((e for e in p["enum"] if e != p.get("default")), p["enum"][0])
    elif p["type"] == "boolean":
        value = not p.get("default", False) if isinstance(p.get("default"), bool) else True
    else:
        value = 3 if p.get("default") != 3 else 4
    new = dict(args, **{k: value})
    return drift_entry(call, kind_for(call, new), k, None, value, "added"), new


def r_enum(rng, call):
    args, props = call["answer"]["args"], props_of(call)
    keys = [k for k, v in args.items() if isinstance(v, str) and "enum" in props.get(k, {})]
    if not keys:
        return None
    k = rng.choice(keys)
    new = dict(args, **{k: args[k].upper() if args[k].upper() != args[k] else args[k].lower()})
    if new[k] in props[k]["enum"]:
        return None
    return drift_entry(call, kind_for(call, new), k, args[k], new[k], "value_changed"), new


def nested_leaves(value, path):
    """(path, leaf) pairs below the top level: `budget.max`, `conditions[1].value`, `tags[0]`."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from nested_leaves(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from nested_leaves(v, f"{path}[{i}]")
    elif "." in path or "[" in path:
        yield path, value


def set_path(obj, path: str, value):
    parts = re.findall(r"\.?([^.\[\]]+)|\[(\d+)\]", path)
    keys = [int(i) if i else k for k, i in parts]
    for key in keys[:-1]:
        obj = obj[key]
    obj[keys[-1]] = value


def r_nested(rng, call):
    args = call["answer"]["args"]
    leaves = [
        (p, v)
        for k, v in args.items()
        for p, v in nested_leaves(v, k)
        if (isinstance(v, (int, float)) and not isinstance(v, bool)) or (isinstance(v, str) and len(v) > 1)
    ]
    if not leaves:
        return None
    path, old = rng.choice(leaves)
    new_value = change_string(rng, old) if isinstance(old, str) else append_digit(rng, old)
    new = copy.deepcopy(args)
    set_path(new, path, new_value)
    if new_value == old:
        return None
    return drift_entry(call, kind_for(call, new), path, old, new_value, "value_changed"), new


def r_tool_name(rng, call):
    names = [t["function"]["name"] for t in call["tools"] if t["function"]["name"] != call["answer"]["name"]]
    if not names:
        return None
    other = rng.choice(names)
    return drift_entry(call, "tool_name_changed", None, call["answer"]["name"], other), ("rename", other)


def r_extra_call(rng, call):
    if len(call["turn"]) < 2:
        return None
    return drift_entry(call, "call_count_changed", None, 1, 2), ("extra", call["turn"][1])


def r_unparseable(style):
    def recipe(rng, call):
        a = call["answer"]
        text = json.dumps({"name": a["name"], "arguments": a["args"]}, ensure_ascii=False)
        if style == "truncated":  # cut at max_tokens (finish_reason "length"): truncated, not compared
            broken = text[: max(12, len(text) * 2 // 3)]
        else:  # hermes-style block with the closing brace dropped
            broken = "<tool_call>\n" + text[:-1] + "\n</tool_call>"
        kind = "truncated" if style == "truncated" else "unparseable"
        return drift_entry(call, kind, None, a["name"], broken), ("text", broken, style)

    return recipe


RECIPES = [
    ("number", r_number),
    ("number", r_number),
    ("number", r_number),
    ("string", r_string),
    ("string", r_string),
    ("type", r_type),
    ("type", r_type),
    ("missing_required", r_missing(True)),
    ("missing_optional", r_missing(False)),
    ("added", r_added),
    ("enum", r_enum),
    ("nested", r_nested),
    ("nested", r_nested),
    ("nested", r_nested),
    ("tool_name", r_tool_name),
    ("tool_name", r_tool_name),
    ("extra_call", r_extra_call),
    ("extra_call", r_extra_call),
    ("unparseable", r_unparseable("truncated")),
    ("unparseable", r_unparseable("hermes")),
]




def apply_drift(resp: dict, edit, rng) -> None:
    """Write a recipe's edit into the candidate's response, and recount its completion tokens."""
    choice = resp["choices"][0]
    message = choice["message"]
    if isinstance(edit, dict):  # new arguments
        message["tool_calls"][0]["function"]["arguments"] = dumps(edit)
    elif edit[0] == "rename":
        message["tool_calls"][0]["function"]["name"] = edit[1]
    elif edit[0] == "extra":
        extra = edit[1]
        message["tool_calls"].append(tool_call("call_" + rand_id(rng, 24), extra["name"], dumps(extra["args"])))
    elif edit[0] == "text":
        message.pop("tool_calls")
        message["content"] = edit[1]
        choice["finish_reason"] = "length" if edit[2] == "truncated" else "stop"
    resp["usage"] = usage(resp["usage"]["prompt_tokens"], message)
