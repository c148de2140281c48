"""The example canary night's sessions: BFCL questions and answers arranged as agent sessions per customer.

A session is a list of calls, each with the tools offered, the recorded context (earlier turns with their
tool results and a short summary) and the ground-truth answer. Sessions come from BFCL `multi_turn_base`
(whole sessions) and from groups of BFCL `multiple` questions; the last 3 sessions are the ones that appear
in one log only.
"""

from __future__ import annotations

import random
from pathlib import Path

from . import bfcl
from .chat import finished_turn, rand_id, tool_call
from .files import dumps

MODEL = "meta-llama/Llama-3.3-70B-Instruct"
EPOCH = 1767225600  # 2026-01-01T00:00:00Z: the canary night
CUSTOMERS = ["acme-bank", "globex-health", "initech", "umbrella-retail"]
CUSTOMER_WEIGHTS = [45, 25, 20, 10]  # unequal traffic
N_SESSIONS = 120  # matched sessions: BFCL multi_turn_base sessions fill up what `multiple` groups leave
N_MULTIPLE = 60  # sessions built by grouping BFCL `multiple` questions (fewer if the 200 questions run out)
N_UNMATCHED = 3  # extra sessions: two only in the baseline log, one only in the candidate log
MAX_SESSION_TOOLS = 4
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


def new_call(rng: random.Random, name: str, args: dict, fn: dict) -> dict:
    return {"id": "call_" + rand_id(rng, 24), "name": name, "args": args, "result": bfcl.tool_result(fn, args, rng)}


def recorded_turn(rng: random.Random, user: str, calls: list[dict]) -> list[dict]:
    """A finished turn in the recorded context, its summary naming the turn's last tool."""
    summary = rng.choice(SUMMARIES).format(tool=calls[-1]["name"])
    return finished_turn(user, [(tool_call(c["id"], c["name"], dumps(c["args"])), c["result"]) for c in calls], summary)


def multi_turn_session(rng: random.Random, entry: dict) -> list[dict]:
    """A BFCL multi-turn session: each turn's first ground-truth call is the answer, the rest its context."""
    fns = {fn["name"]: fn for fn in entry["fns"]}
    turns = []
    for turn in entry["gt"]:
        parsed = [bfcl.parse_call(src, fns) for src in turn]
        turns.append([new_call(rng, name, args, fns[name]) for name, args in parsed])
    used = {c["name"] for turn in turns for c in turn}
    others = [n for n in fns if n not in used]
    keep = used | set(rng.sample(others, min(len(others), max(0, MAX_SESSION_TOOLS - len(used)))))
    tools = [bfcl.tool_def(fns[n]) for n in fns if n in keep]  # BFCL doc order
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
        history = history + recorded_turn(rng, user, turn)
    return calls


def multiple_session(rng: random.Random, entries: list[dict]) -> list[dict]:
    """BFCL `multiple` questions asked one after the other, each with its own tools."""
    calls, history = [], []
    for e in entries:
        fns = {fn["name"]: fn for fn in e["fns"]}
        call = new_call(rng, *e["call"], fns[e["call"][0]])
        calls.append(
            {
                "tools": [bfcl.tool_def(fn) for fn in e["fns"]],
                "messages": history + [{"role": "user", "content": e["user"]}],
                "answer": call,
                "turn": [call],
                "fns": fns,
            }
        )
        history = history + recorded_turn(rng, e["user"], [call])
    return calls


def build_sessions(rng: random.Random, bfcl_dir: Path) -> list[dict]:
    """`N_SESSIONS` matched sessions in shuffled order, then `N_UNMATCHED` more; customers and times drawn."""
    multi = bfcl.load_multi_turn(bfcl_dir)
    groups, pool = [], bfcl.load_multiple(bfcl_dir)
    rng.shuffle(pool)
    while len(groups) < N_MULTIPLE:
        size = rng.choice([2, 2, 3, 3, 3, 4, 4, 5, 6])
        if len(pool) < size:
            break
        groups.append([pool.pop() for _ in range(size)])
    n_multi_turn = N_SESSIONS - len(groups)
    picked = rng.sample(multi, n_multi_turn + N_UNMATCHED)
    sources = [("mt", e) for e in picked[:n_multi_turn]] + [("mc", g) for g in groups]
    rng.shuffle(sources)
    sources += [("mt", e) for e in picked[n_multi_turn:]]
    sessions = []
    for kind, src in sources:
        customer = rng.choices(CUSTOMERS, CUSTOMER_WEIGHTS)[0]
        calls = multi_turn_session(rng, src) if kind == "mt" else multiple_session(rng, src)
        sid = f"sess-{rng.getrandbits(48):012x}"
        t = EPOCH + rng.randint(0, 6 * 3600)
        for i, c in enumerate(calls):
            c["created"] = t
            t += rng.randint(3, 45)
            c["session_id"], c["call_index"], c["customer"] = sid, i, customer
            c["source"] = src["id"] if kind == "mt" else src[i]["id"]
        sessions.append({"session_id": sid, "customer": customer, "calls": calls})
    return sessions
