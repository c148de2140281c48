"""The example canary logs: baseline and candidate records from the sessions, edited, ordered, explained.

The baseline answers with BFCL's ground truth. The candidate answers the same except for the injected drifts
(`drifts.RECIPES`), three text-only differences and twenty pure reformattings (key order, whitespace, ids,
`created`, `system_fingerprint`: not drift). Each step draws from the one seeded generator in turn, so the
order of the steps below is part of the output.
"""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from . import chat
from .bfcl_schema import is_valid
from .drifts import RECIPES, apply_drift, schema_of
from .example_sessions import CUSTOMERS, MODEL, N_UNMATCHED, SYSTEM_PROMPTS, build_sessions
from .files import dumps

SEED = 7
N_REFORMATTED = 20
TEXT_ONLY = [  # (baseline content, candidate content) beside the same tool call
    (None, "Sure, calling the tool now."),
    (None, "Let me take care of that."),
    ("I'll run that for you.", "I will run that for you now."),
]
LINE_SWAPS = 12  # neighbouring lines swapped: the candidate log is not in exactly the baseline's order
DESCRIPTION = (
    "Ground truth for traces/example_baseline.jsonl vs traces/example_candidate.jsonl, "
    "built by scripts/make_example_traces.py from BFCL v4 (Apache-2.0). Calls are keyed by "
    "metadata.session_id and metadata.call_index (an int here, a string in the logs). A drift's path is "
    "null for tool_name_changed / call_count_changed / unparseable; there baseline/candidate hold the tool "
    "names, the call counts, or the baseline tool name and the raw candidate text. arg_kind is "
    "value_changed / type_changed / added / missing for argument drifts, else null. Reformatted calls "
    "differ only in key order, whitespace, ids, created and system_fingerprint: not drift. Truncated calls "
    "(the candidate stopped at max_tokens, finish_reason length) are not compared: not drift either."
)
REFORMAT_CHANGES = ["arguments key order/whitespace", "tool_call id", "response id", "created", "system_fingerprint"]


@dataclass
class Night:
    """Both logs' records by (session, call index) while they are edited, and the calls already edited."""

    base: dict = field(default_factory=dict)
    cand: dict = field(default_factory=dict)
    used: set = field(default_factory=set)


def key_of(call: dict) -> tuple[str, int]:
    return call["session_id"], call["call_index"]


def record_calls(rng: random.Random, sessions: list[dict], fingerprint: str) -> Night:
    """Every call's request and ground-truth response, the candidate starting as a copy of the baseline."""
    night = Night()
    for sess in sessions:
        system = {"role": "system", "content": SYSTEM_PROMPTS[sess["customer"]]}
        for call in sess["calls"]:
            messages = [system] + call["messages"]
            req = chat.request(MODEL, messages, call["tools"], sess["session_id"], sess["customer"], call["call_index"])
            prompt = chat.prompt_tokens(req)
            a = call["answer"]
            resp = chat.response(
                "chatcmpl-" + chat.rand_id(rng, 29),
                call["created"],
                MODEL,
                fingerprint,
                prompt,
                [chat.tool_call(a["id"], a["name"], dumps(a["args"]))],
            )
            night.base[key_of(call)] = {"request": req, "response": resp}
            night.cand[key_of(call)] = copy.deepcopy(night.base[key_of(call)])
    return night


def inject_drifts(rng: random.Random, night: Night, calls: list[dict]) -> list[dict]:
    """One drift per recipe, on the first call (in `calls` order) that fits it and is schema-valid."""
    drifts = []
    for label, recipe in RECIPES:
        for call in calls:
            if key_of(call) in night.used:
                continue
            if not is_valid(call["answer"]["args"], schema_of(call)):
                continue  # only drift from a schema-valid baseline, so the expected kind is unambiguous
            got = recipe(rng, call)
            if got is None:
                continue
            entry, edit = got
            night.used.add(key_of(call))
            apply_drift(night.cand[key_of(call)]["response"], edit, rng)
            drifts.append(entry)
            break
        else:
            raise SystemExit(f"no eligible call for drift recipe {label}")
    return drifts


def add_text_only(night: Night, calls: list[dict]) -> list[dict]:
    """Assistant text beside an unchanged tool call: a text_only difference, not drift."""
    text_only = []
    for base_text, cand_text in TEXT_ONLY:
        call = next(c for c in calls if key_of(c) not in night.used)
        key = key_of(call)
        night.used.add(key)
        if base_text is not None:
            night.base[key]["response"]["choices"][0]["message"]["content"] = base_text
        night.cand[key]["response"]["choices"][0]["message"]["content"] = cand_text
        text_only.append(
            {
                "session_id": key[0],
                "call_index": key[1],
                "tool": call["answer"]["name"],
                "baseline": base_text,
                "candidate": cand_text,
            }
        )
    return text_only


def reformat_args(rng: random.Random, args: dict) -> str:
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


def add_reformatted(rng: random.Random, night: Night, calls: list[dict], fingerprint: str) -> list[dict]:
    """The same call written differently (new ids, another fingerprint, keys reordered): not drift."""
    reformatted = []
    for call in calls:
        if len(reformatted) == N_REFORMATTED:
            break
        key = key_of(call)
        if key in night.used or not call["answer"]["args"]:
            continue  # "{}" has no key order or whitespace to change
        night.used.add(key)
        resp = night.cand[key]["response"]
        resp["id"] = "chatcmpl-" + chat.rand_id(rng, 29)
        resp["created"] = resp["created"] + rng.randint(1, 3)
        resp["system_fingerprint"] = fingerprint
        tcall = resp["choices"][0]["message"]["tool_calls"][0]
        tcall["id"] = "call_" + chat.rand_id(rng, 24)
        tcall["function"]["arguments"] = reformat_args(rng, call["answer"]["args"])
        reformatted.append(
            {"session_id": key[0], "call_index": key[1], "tool": call["answer"]["name"], "changes": REFORMAT_CHANGES}
        )
    return reformatted


def line_order(rng: random.Random, night: Night, unmatched: list[dict]) -> tuple[list, list]:
    """Each log's keys in time order; two sessions only in the baseline, one only in the candidate."""
    base = night.base
    base_keys = [
        k
        for k in sorted(base, key=lambda k: (base[k]["response"]["created"], k))
        if k[0] != unmatched[2]["session_id"]
    ]
    cand_keys = [k for k in base_keys if k[0] not in (unmatched[0]["session_id"], unmatched[1]["session_id"])]
    cand_keys += [(unmatched[2]["session_id"], c["call_index"]) for c in unmatched[2]["calls"]]
    cand_keys.sort(key=lambda k: (base[k]["response"]["created"], k))
    for _ in range(LINE_SWAPS):
        j = rng.randrange(len(cand_keys) - 1)
        cand_keys[j], cand_keys[j + 1] = cand_keys[j + 1], cand_keys[j]
    return base_keys, cand_keys


def by_call(entry: dict) -> tuple[str, int]:
    return entry["session_id"], entry["call_index"]


def build(bfcl_dir: Path) -> tuple[list[dict], list[dict], dict]:
    """(baseline records, candidate records, expected-drifts document), the same on every run."""
    rng = random.Random(SEED)
    sessions = build_sessions(rng, bfcl_dir)
    matched, unmatched = sessions[:-N_UNMATCHED], sessions[-N_UNMATCHED:]
    fingerprint = chat.fingerprint(rng)
    other_fingerprint = chat.fingerprint(rng)
    night = record_calls(rng, sessions, fingerprint)

    all_calls = [c for s in matched for c in s["calls"]]
    order = list(range(len(all_calls)))
    rng.shuffle(order)
    shuffled = [all_calls[i] for i in order]
    injected = inject_drifts(rng, night, shuffled)
    drifts = [d for d in injected if d["kind"] != "truncated"]
    truncated = [d for d in injected if d["kind"] == "truncated"]
    text_only = add_text_only(night, shuffled)
    reformatted = add_reformatted(rng, night, shuffled, other_fingerprint)
    base_keys, cand_keys = line_order(rng, night, unmatched)

    expected = {
        "description": DESCRIPTION,
        "counts": {
            "sessions_matched": len(matched),
            "calls_matched": len(all_calls),
            "baseline_calls": len(base_keys),
            "candidate_calls": len(cand_keys),
            "drifted_calls": len(drifts),
            "truncated_calls": len(truncated),
            "text_only_calls": len(text_only),
            "reformatted_calls": len(reformatted),
            "customers": {c: sum(1 for s in matched if s["customer"] == c) for c in CUSTOMERS},
        },
        "drifts": sorted(drifts, key=by_call),
        "truncated": sorted(truncated, key=by_call),
        "text_only": sorted(text_only, key=by_call),
        "reformatted": sorted(reformatted, key=by_call),
        "unmatched": {
            "baseline_only": [unmatched[0]["session_id"], unmatched[1]["session_id"]],
            "candidate_only": [unmatched[2]["session_id"]],
        },
    }
    return [night.base[k] for k in base_keys], [night.cand[k] for k in cand_keys], expected
