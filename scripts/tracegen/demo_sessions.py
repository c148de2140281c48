"""The demo sessions: per customer, a few tools of one domain and 3-5 turns whose prompts stay compact.

Every recorded response is the production answer: one tool call that validates against its schema file. A
session ends a call early once its prompt would pass `PROMPT_CHAR_BUDGET` (SmolLM2's tokenizer gives at most
~0.48 tokens per rendered character on these prompts, so every prompt stays under ~700 tokens).
"""

from __future__ import annotations

import random

from . import chat
from .demo_tools import CUSTOMERS, DOMAINS, request_tool
from .demo_turns import TURNS
from .files import dumps

SEED = 7
N_SESSIONS = 68
MODEL = "gpt-4o-mini-2024-07-18"
EPOCH = 1767312000  # 2026-01-02T00:00:00Z
PROMPT_CHAR_BUDGET = 1550
DONE = ["Done.", "Done.", "All set.", "Completed."]


def prompt_chars(request: dict) -> int:
    """Characters a chat template renders (tool JSON, contents, tool calls): SmolLM2's tokenizer gives at most
    ~0.48 tokens per such character on these prompts, so the budget keeps every prompt under ~700 tokens."""
    n = len(dumps([t["function"] for t in request["tools"]]))
    for m in request["messages"]:
        n += 12 + len(m.get("content") or "")
        for tc in m.get("tool_calls") or []:
            n += 20 + len(tc["function"]["name"]) + len(tc["function"]["arguments"])
    return n


def session_records(rng: random.Random, s: int, fingerprint: str) -> list[dict]:
    """Session number `s`: the first sessions cycle through customers and domains so every one appears."""
    names = list(CUSTOMERS)
    weights = [CUSTOMERS[c][2] for c in names]
    customer = names[s % len(names)] if s < len(names) else rng.choices(names, weights)[0]
    display, domains, _ = CUSTOMERS[customer]
    domain = domains[s % len(domains)] if s < 16 else rng.choice(domains)
    pool = DOMAINS[domain]
    tools = sorted(rng.sample(pool, min(len(pool), rng.randint(2, 4))), key=pool.index)
    n_calls = rng.randint(3, 5)
    sid = f"demo-{rng.getrandbits(40):010x}"
    system = {"role": "system", "content": f"You are {display}'s assistant. Answer each request with one tool call."}
    records, history, state = [], [system], {}
    t = EPOCH + rng.randint(0, 8 * 3600)
    for i in range(n_calls):
        name = tools[i % len(tools)] if i < len(tools) else rng.choice(tools)
        text, args, result = TURNS[name](rng, state)
        call_id = "call_" + chat.rand_id(rng, 24)
        request = chat.request(
            MODEL, history + [{"role": "user", "content": text}], [request_tool(n) for n in tools], sid, customer, i
        )
        if i >= 3 and prompt_chars(request) > PROMPT_CHAR_BUDGET:
            break  # keep every prompt compact: the session ends a call early
        call = chat.tool_call(call_id, name, dumps(args))
        response = chat.response(
            "chatcmpl-" + chat.rand_id(rng, 29), t, MODEL, fingerprint, chat.prompt_tokens(request), [call]
        )
        records.append({"request": request, "response": response})
        history = history + chat.finished_turn(text, [(call, dumps(result))], rng.choice(DONE))
        t += rng.randint(5, 60)
    return records


def build() -> list[dict]:
    """All demo records in time order, the same on every run."""
    rng = random.Random(SEED)
    fingerprint = chat.fingerprint(rng)
    records = [r for s in range(N_SESSIONS) for r in session_records(rng, s, fingerprint)]
    records.sort(key=lambda r: (r["response"]["created"], r["request"]["metadata"]["session_id"]))
    return records
