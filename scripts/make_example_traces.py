#!/usr/bin/env python3
"""Build the example canary traces from BFCL: one baseline log, one candidate log, and the expected drifts.

The story: a nightly canary sends the same recorded agent requests to a target-only endpoint (baseline) and
to a speculative-decoding endpoint (candidate). The baseline answers with BFCL's ground truth; the candidate
answers identically except for pure reformattings (not drift), text-only differences, and injected drifts
recorded in example_expected.json.

Standard library only; seeded with random.Random(7), so reruns are byte-identical.

    python scripts/make_example_traces.py [--out-dir traces] [--bfcl-dir ../shared/data/bfcl]
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import random
import re
import string
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_BFCL = Path(os.environ.get("TOOLAUDIT_BFCL_DIR", REPO.parent / "shared" / "data" / "bfcl"))

SEED = 7
MODEL = "meta-llama/Llama-3.3-70B-Instruct"
EPOCH = 1767225600  # 2026-01-01T00:00:00Z: the canary night
CUSTOMERS = ["acme-bank", "globex-health", "initech", "umbrella-retail"]
CUSTOMER_WEIGHTS = [45, 25, 20, 10]  # unequal traffic
N_SESSIONS = 120  # matched sessions: BFCL multi_turn_base sessions fill up what `multiple` groups leave
N_MULTIPLE = 60  # sessions built by grouping BFCL `multiple` questions (fewer if the 200 questions run out)
N_REFORMATTED = 20
MAX_SESSION_TOOLS = 4

# BFCL multi-turn class name -> multi_turn_func_doc file
CLASS_FILES = {
    "GorillaFileSystem": "gorilla_file_system",
    "MathAPI": "math_api",
    "MessageAPI": "message_api",
    "TwitterAPI": "posting_api",
    "TicketAPI": "ticket_api",
    "TradingBot": "trading_bot",
    "TravelAPI": "travel_booking",
    "VehicleControlAPI": "vehicle_control",
}
SYSTEM_PROMPTS = {
    "acme-bank": "You are Acme Bank's operations assistant. Use the provided tools to carry out each request; "
    "never invent tool results.",
    "globex-health": "You are the Globex Health back-office agent. Call the tools needed for the user's request "
    "and keep answers brief.",
    "initech": "You are Initech's internal automation agent. Prefer calling a tool over answering from memory.",
    "umbrella-retail": "You are Umbrella Retail's assistant. Use tools for every action and report results "
    "concisely.",
}
SUMMARIES = ["Done.", "Done: {tool} completed.", "All set.", "{tool} finished successfully.", "Completed."]
TEXT_ONLY = [
    (None, "Sure, calling the tool now."),
    (None, "Let me take care of that."),
    ("I'll run that for you.", "I will run that for you now."),
]
OMIT = object()


# ---------------------------------------------------------------- small helpers


def dumps_line(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def args_json(args: dict) -> str:
    """The baseline endpoint's arguments string: compact, keys in ground-truth order."""
    return json.dumps(args, ensure_ascii=False, separators=(",", ":"))


def rand_id(rng: random.Random, n: int) -> str:
    alphabet = string.ascii_letters + string.digits
    return "".join(rng.choice(alphabet) for _ in range(n))


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def tool_def(fn: dict) -> dict:
    """A BFCL function doc as an OpenAI tool; BFCL's messy types (dict/float/tuple/any) are kept as-is."""
    return {
        "type": "function",
        "function": {"name": fn["name"], "description": fn["description"], "parameters": fn["parameters"]},
    }


# ---------------------------------------------------------------- a tiny validator for BFCL-style schemas
# Used only to decide whether an injected change breaks the schema (expected kind "schema_broken").
# Normalisation: dict -> object, float -> number, tuple -> array, any -> unconstrained; `optional` ignored.

TYPE_CHECKS = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "dict": lambda v: isinstance(v, dict),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "tuple": lambda v: isinstance(v, list),
}


def is_valid(value, schema: dict) -> bool:
    t = schema.get("type")
    if t in TYPE_CHECKS and not TYPE_CHECKS[t](value):
        return False
    if "enum" in schema and value not in schema["enum"]:
        return False
    if isinstance(value, dict) and t in ("dict", "object"):
        props = schema.get("properties", {})
        if any(r not in value for r in schema.get("required", [])):
            return False
        return all(is_valid(v, props[k]) for k, v in value.items() if k in props)
    if isinstance(value, list) and "items" in schema:
        return all(is_valid(v, schema["items"]) for v in value)
    return True


# ---------------------------------------------------------------- BFCL ground truth


def resolve_allowed(allowed: list):
    """BFCL `multiple` answers list allowed values; take the first. "" first means the optional arg is omitted."""
    first = allowed[0]
    return OMIT if first == "" else resolve_value(first)


def resolve_value(v):
    if isinstance(v, dict):  # nested dicts list allowed values per key, like the top level
        out = {}
        for k, allowed in v.items():
            r = resolve_allowed(allowed)
            if r is not OMIT:
                out[k] = r
        return out
    if isinstance(v, list):
        return [resolve_value(e) for e in v]
    return v


def parse_call(src: str, fns: dict) -> tuple[str, dict]:
    """A multi-turn answer like "mv(source='a', destination='b')" or "sort('a')" -> (name, arguments)."""
    node = ast.parse(src, mode="eval").body
    name = node.func.id
    order = list(fns[name]["parameters"]["properties"])
    args = {order[i]: ast.literal_eval(a) for i, a in enumerate(node.args)}  # positional -> declared order
    for kw in node.keywords:
        args[kw.arg] = ast.literal_eval(kw.value)
    return name, args


def fake_value(key: str, schema: dict, rng: random.Random, echo: dict, depth: int = 0):
    """A short plausible value for a tool-result field (echoes the call's arguments where names match)."""
    if key in echo:
        return echo[key]
    t = schema.get("type")
    if t == "boolean":
        return True
    if t == "integer":
        return rng.randint(1, 99)
    if t in ("float", "number"):
        return round(rng.uniform(1, 500), 2)
    if t == "array":
        return [] if depth else [fake_value(key, schema.get("items", {}), rng, {}, depth + 1)]
    if t == "dict":
        props = list(schema.get("properties", {}).items())[:3]
        return {k: fake_value(k, v, rng, echo, depth + 1) for k, v in props} if depth < 2 else {}
    lowered = key.lower()
    if "status" in lowered:
        return "success"
    if "message" in lowered or "result" in lowered:
        return "Operation completed successfully."
    if "directory" in lowered or "path" in lowered:
        return "/workspace"
    return "ok"


def tool_result(fn: dict, args: dict, rng: random.Random) -> str:
    response = fn.get("response")
    if response and response.get("properties"):
        value = {k: fake_value(k, v, rng, args) for k, v in list(response["properties"].items())[:4]}
    else:
        value = {"status": "success", "result": round(rng.uniform(1, 1000), 2)}
    return json.dumps(value, ensure_ascii=False)


# ---------------------------------------------------------------- sessions


def load_multi_turn(bfcl: Path):
    docs = {c: read_jsonl(bfcl / "multi_turn_func_doc" / f"{f}.json") for c, f in CLASS_FILES.items()}
    entries = read_jsonl(bfcl / "BFCL_v4_multi_turn_base.json")
    answers = {
        a["id"]: a["ground_truth"]
        for a in read_jsonl(bfcl / "possible_answer" / "BFCL_v4_multi_turn_base.json")
    }
    out = []
    for e in entries:
        gt = answers[e["id"]]
        if not 2 <= len(gt) <= 5 or any(not turn for turn in gt):
            continue
        excluded = set(e.get("excluded_function", []))
        fns = [fn for c in e["involved_classes"] for fn in docs[c] if fn["name"] not in excluded]
        out.append({"id": e["id"], "turns": [t[0]["content"] for t in e["question"]], "gt": gt, "fns": fns})
    return out


def load_multiple(bfcl: Path):
    entries = read_jsonl(bfcl / "BFCL_v4_multiple.json")
    answers = {
        a["id"]: a["ground_truth"] for a in read_jsonl(bfcl / "possible_answer" / "BFCL_v4_multiple.json")
    }
    out = []
    for e in entries:
        ((name, allowed),) = answers[e["id"]][0].items()
        args = {}
        for k, a in allowed.items():
            r = resolve_allowed(a)
            if r is not OMIT:
                args[k] = r
        out.append(
            {
                "id": e["id"],
                "user": e["question"][0][0]["content"],
                "fns": e["function"],
                "call": (name, args),
            }
        )
    return out


def new_call(rng, name, args, fn):
    return {
        "id": "call_" + rand_id(rng, 24),
        "name": name,
        "args": args,
        "result": tool_result(fn, args, rng),
    }


def assistant_tool_msg(call) -> dict:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call["id"],
                "type": "function",
                "function": {"name": call["name"], "arguments": args_json(call["args"])},
            }
        ],
    }


def turn_messages(rng, user: str, calls: list[dict]) -> list[dict]:
    """A finished turn in the recorded context: user, each tool call and its result, a short summary."""
    msgs = [{"role": "user", "content": user}]
    for c in calls:
        msgs.append(assistant_tool_msg(c))
        msgs.append({"role": "tool", "tool_call_id": c["id"], "content": c["result"]})
    msgs.append({"role": "assistant", "content": rng.choice(SUMMARIES).format(tool=calls[-1]["name"])})
    return msgs


def build_multi_turn_session(rng, entry):
    fns = {fn["name"]: fn for fn in entry["fns"]}
    turns = []
    for turn in entry["gt"]:
        parsed = [parse_call(src, fns) for src in turn]
        turns.append([new_call(rng, name, args, fns[name]) for name, args in parsed])
    used = {c["name"] for turn in turns for c in turn}
    others = [n for n in fns if n not in used]
    keep = used | set(rng.sample(others, min(len(others), max(0, MAX_SESSION_TOOLS - len(used)))))
    tools = [tool_def(fns[n]) for n in fns if n in keep]  # BFCL doc order
    calls, history = [], []
    for user, turn in zip(entry["turns"], turns):
        calls.append(
            {
                "tools": tools,
                "messages": history + [{"role": "user", "content": user}],
                "answer": turn[0],
                "turn": turn,
                "fns": fns,
            }
        )
        history = history + turn_messages(rng, user, turn)
    return calls


def build_multiple_session(rng, entries):
    calls, history = [], []
    for e in entries:
        fns = {fn["name"]: fn for fn in e["fns"]}
        call = new_call(rng, *e["call"], fns[e["call"][0]])
        calls.append(
            {
                "tools": [tool_def(fn) for fn in e["fns"]],
                "messages": history + [{"role": "user", "content": e["user"]}],
                "answer": call,
                "turn": [call],
                "fns": fns,
            }
        )
        history = history + turn_messages(rng, e["user"], [call])
    return calls


def build_sessions(rng, bfcl: Path):
    multi = load_multi_turn(bfcl)
    groups, pool = [], load_multiple(bfcl)
    rng.shuffle(pool)
    while len(groups) < N_MULTIPLE:
        size = rng.choice([2, 2, 3, 3, 3, 4, 4, 5, 6])
        if len(pool) < size:
            break
        groups.append([pool.pop() for _ in range(size)])
    n_multi_turn = N_SESSIONS - len(groups)
    picked = rng.sample(multi, n_multi_turn + 3)  # 3 extra become the unmatched sessions
    sources = [("mt", e) for e in picked[:n_multi_turn]] + [("mc", g) for g in groups]
    rng.shuffle(sources)
    sources += [("mt", e) for e in picked[n_multi_turn:]]
    sessions = []
    for kind, src in sources:
        customer = rng.choices(CUSTOMERS, CUSTOMER_WEIGHTS)[0]
        calls = build_multi_turn_session(rng, src) if kind == "mt" else build_multiple_session(rng, src)
        sid = f"sess-{rng.getrandbits(48):012x}"
        start = EPOCH + rng.randint(0, 6 * 3600)
        t = start
        for i, c in enumerate(calls):
            c["created"] = t
            t += rng.randint(3, 45)
            c["session_id"], c["call_index"], c["customer"] = sid, i, customer
            c["source"] = src["id"] if kind == "mt" else src[i]["id"]
        sessions.append({"session_id": sid, "customer": customer, "calls": calls})
    return sessions


# ---------------------------------------------------------------- records


def request_body(sess, call) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "system", "content": SYSTEM_PROMPTS[sess["customer"]]}] + call["messages"],
        "tools": call["tools"],
        "tool_choice": "auto",
        "temperature": 0,
        "metadata": {
            "session_id": sess["session_id"],
            "customer": sess["customer"],
            "call_index": str(call["call_index"]),
        },
    }


def response_body(
    resp_id, created, fingerprint, prompt_tokens, tool_calls, content=None, finish_reason="tool_calls"
) -> dict:
    message = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    completion = sum(len(tc["function"]["arguments"]) // 3 + 8 for tc in tool_calls or [])
    completion += len(content or "") // 4
    return {
        "id": resp_id,
        "object": "chat.completion",
        "created": created,
        "model": MODEL,
        "system_fingerprint": fingerprint,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
        },
    }


def tc(call_id, name, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# ---------------------------------------------------------------- injected drifts
# Each recipe looks at a call and returns (expected entry, candidate response edit) or None if not eligible.


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
        if style == "truncated":
            broken = text[: max(12, len(text) * 2 // 3)]
        else:  # hermes-style block with the closing brace dropped
            broken = "<tool_call>\n" + text[:-1] + "\n</tool_call>"
        return drift_entry(call, "unparseable", None, a["name"], broken), ("text", broken, style)

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


# ---------------------------------------------------------------- assembling both logs


def reformat_args(rng, args: dict) -> str:
    keys = list(args)
    if len(keys) > 1:
        shuffled = keys[:]
        while shuffled == keys:
            rng.shuffle(shuffled)
        keys = shuffled
    reordered = {k: args[k] for k in keys}
    style = rng.choice(["spaced", "indented"])
    if style == "indented":
        return json.dumps(reordered, ensure_ascii=False, indent=2)
    return json.dumps(reordered, ensure_ascii=False, separators=(", ", ": "))


def build(bfcl: Path):
    rng = random.Random(SEED)
    sessions = build_sessions(rng, bfcl)
    matched, unmatched = sessions[:-3], sessions[-3:]
    fingerprint = "fp_" + "".join(rng.choice("0123456789abcdef") for _ in range(10))
    other_fingerprint = "fp_" + "".join(rng.choice("0123456789abcdef") for _ in range(10))

    base_records, cand_records = {}, {}
    for sess in sessions:
        for call in sess["calls"]:
            req = request_body(sess, call)
            prompt_tokens = len(dumps_line(req["messages"]) + dumps_line(req["tools"])) // 4
            a = call["answer"]
            resp = response_body(
                "chatcmpl-" + rand_id(rng, 29),
                call["created"],
                fingerprint,
                prompt_tokens,
                [tc(a["id"], a["name"], args_json(a["args"]))],
            )
            key = (sess["session_id"], call["call_index"])
            call["prompt_tokens"] = prompt_tokens
            base_records[key] = {"request": req, "response": resp}
            cand_records[key] = copy.deepcopy(base_records[key])

    all_calls = [c for s in matched for c in s["calls"]]
    order = list(range(len(all_calls)))
    rng.shuffle(order)
    used = set()

    drifts = []
    for label, recipe in RECIPES:
        for i in order:
            call = all_calls[i]
            key = (call["session_id"], call["call_index"])
            if key in used:
                continue
            args = call["answer"]["args"]
            if not is_valid(args, schema_of(call)):
                continue  # only drift from a schema-valid baseline, so the expected kind is unambiguous
            got = recipe(rng, call)
            if got is None:
                continue
            entry, edit = got
            used.add(key)
            apply_drift(cand_records[key]["response"], call, edit, label, rng)
            drifts.append(entry)
            break
        else:
            raise SystemExit(f"no eligible call for drift recipe {label}")

    text_only = []
    for base_text, cand_text in TEXT_ONLY:
        i = next(i for i in order if (all_calls[i]["session_id"], all_calls[i]["call_index"]) not in used)
        call = all_calls[i]
        key = (call["session_id"], call["call_index"])
        used.add(key)
        if base_text is not None:
            base_records[key]["response"]["choices"][0]["message"]["content"] = base_text
        cand_records[key]["response"]["choices"][0]["message"]["content"] = cand_text
        text_only.append(
            {
                "session_id": key[0],
                "call_index": key[1],
                "tool": call["answer"]["name"],
                "baseline": base_text,
                "candidate": cand_text,
            }
        )

    reformatted = []
    for i in order:
        if len(reformatted) == N_REFORMATTED:
            break
        call = all_calls[i]
        key = (call["session_id"], call["call_index"])
        if key in used or not call["answer"]["args"]:
            continue  # "{}" has no key order or whitespace to change
        used.add(key)
        resp = cand_records[key]["response"]
        resp["id"] = "chatcmpl-" + rand_id(rng, 29)
        resp["created"] = resp["created"] + rng.randint(1, 3)
        resp["system_fingerprint"] = other_fingerprint
        tcall = resp["choices"][0]["message"]["tool_calls"][0]
        tcall["id"] = "call_" + rand_id(rng, 24)
        tcall["function"]["arguments"] = reformat_args(rng, call["answer"]["args"])
        reformatted.append(
            {
                "session_id": key[0],
                "call_index": key[1],
                "tool": call["answer"]["name"],
                "changes": [
                    "arguments key order/whitespace",
                    "tool_call id",
                    "response id",
                    "created",
                    "system_fingerprint",
                ],
            }
        )

    base_keys = [
        k
        for k in sorted(base_records, key=lambda k: (base_records[k]["response"]["created"], k))
        if k[0] != unmatched[2]["session_id"]
    ]
    cand_keys = [k for k in base_keys if k[0] not in (unmatched[0]["session_id"], unmatched[1]["session_id"])]
    cand_keys += [(unmatched[2]["session_id"], c["call_index"]) for c in unmatched[2]["calls"]]
    cand_keys.sort(key=lambda k: (base_records[k]["response"]["created"], k))
    for _ in range(12):  # the candidate log is not in exactly the same line order
        j = rng.randrange(len(cand_keys) - 1)
        cand_keys[j], cand_keys[j + 1] = cand_keys[j + 1], cand_keys[j]

    drifts.sort(key=lambda d: (d["session_id"], d["call_index"]))
    text_only.sort(key=lambda d: (d["session_id"], d["call_index"]))
    reformatted.sort(key=lambda d: (d["session_id"], d["call_index"]))
    n_matched_calls = len(all_calls)
    expected = {
        "description": "Ground truth for traces/example_baseline.jsonl vs traces/example_candidate.jsonl, "
        "built by scripts/make_example_traces.py from BFCL v4 (Apache-2.0). Calls are keyed by "
        "metadata.session_id and metadata.call_index (an int here, a string in the logs). A drift's path is "
        "null for tool_name_changed / call_count_changed / unparseable; there baseline/candidate hold the tool "
        "names, the call counts, or the baseline tool name and the raw candidate text. arg_kind is "
        "value_changed / type_changed / added / missing for argument drifts, else null. Reformatted calls "
        "differ only in key order, whitespace, ids, created and system_fingerprint: not drift.",
        "counts": {
            "sessions_matched": len(matched),
            "calls_matched": n_matched_calls,
            "baseline_calls": len(base_keys),
            "candidate_calls": len(cand_keys),
            "drifted_calls": len(drifts),
            "text_only_calls": len(text_only),
            "reformatted_calls": len(reformatted),
            "customers": {c: sum(1 for s in matched if s["customer"] == c) for c in CUSTOMERS},
        },
        "drifts": drifts,
        "text_only": text_only,
        "reformatted": reformatted,
        "unmatched": {
            "baseline_only": [unmatched[0]["session_id"], unmatched[1]["session_id"]],
            "candidate_only": [unmatched[2]["session_id"]],
        },
    }
    return [base_records[k] for k in base_keys], [cand_records[k] for k in cand_keys], expected


def apply_drift(resp, call, edit, label, rng):
    choice = resp["choices"][0]
    message = choice["message"]
    if isinstance(edit, dict):  # new arguments
        message["tool_calls"][0]["function"]["arguments"] = args_json(edit)
    elif edit[0] == "rename":
        message["tool_calls"][0]["function"]["name"] = edit[1]
    elif edit[0] == "extra":
        extra = edit[1]
        message["tool_calls"].append(tc("call_" + rand_id(rng, 24), extra["name"], args_json(extra["args"])))
    elif edit[0] == "text":
        message.pop("tool_calls")
        message["content"] = edit[1]
        choice["finish_reason"] = "length" if edit[2] == "truncated" else "stop"
    usage = resp["usage"]
    usage["completion_tokens"] = sum(
        len(t["function"]["arguments"]) // 3 + 8 for t in message.get("tool_calls", [])
    )
    usage["completion_tokens"] += len(message.get("content") or "") // 4
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]


def write_jsonl(path: Path, records) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(dumps_line(r) + "\n" for r in records)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", type=Path, default=REPO / "traces", help="where the three files go")
    parser.add_argument("--bfcl-dir", type=Path, default=DEFAULT_BFCL, help="BFCL v4 data directory")
    ns = parser.parse_args(argv)
    ns.out_dir.mkdir(parents=True, exist_ok=True)
    baseline, candidate, expected = build(ns.bfcl_dir)
    write_jsonl(ns.out_dir / "example_baseline.jsonl", baseline)
    write_jsonl(ns.out_dir / "example_candidate.jsonl", candidate)
    with open(ns.out_dir / "example_expected.json", "w", encoding="utf-8", newline="\n") as f:
        json.dump(expected, f, ensure_ascii=False, indent=2)
        f.write("\n")
    c = expected["counts"]
    print(
        f"{c['sessions_matched']} matched sessions, {c['calls_matched']} matched calls, "
        f"{c['drifted_calls']} drifts, {c['reformatted_calls']} reformatted, {c['text_only_calls']} text-only "
        f"-> {ns.out_dir}"
    )


if __name__ == "__main__":
    main()
