"""BFCL v4 as raw material for the example sessions: questions, ground-truth calls, tools, made-up results.

Two BFCL sets feed the sessions: `multi_turn_base` (real multi-turn sessions over class APIs such as a file
system or a trading bot) and `multiple` (single questions with several tools offered), grouped into sessions
by the caller. BFCL's ground truth lists allowed values; the first one is the recorded answer.
"""

from __future__ import annotations

import ast
import json
import random
from pathlib import Path

from .chat import function_tool
from .files import read_jsonl

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
OMIT = object()  # an optional argument the ground truth leaves out


def tool_def(fn: dict) -> dict:
    """A BFCL function doc as an OpenAI tool; BFCL's messy types (dict/float/tuple/any) are kept as-is."""
    return function_tool(fn["name"], fn["description"], fn["parameters"])


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


def load_multi_turn(bfcl: Path) -> list[dict]:
    """Multi-turn sessions of 2-5 turns, each turn with at least one call; the tools of their classes."""
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


def load_multiple(bfcl: Path) -> list[dict]:
    """Single questions with their offered tools and one ground-truth call each."""
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
    """The tool message's content: the function's declared response fields, made up, or a generic success."""
    response = fn.get("response")
    if response and response.get("properties"):
        value = {k: fake_value(k, v, rng, args) for k, v in list(response["properties"].items())[:4]}
    else:
        value = {"status": "success", "result": round(rng.uniform(1, 1000), 2)}
    return json.dumps(value, ensure_ascii=False)
