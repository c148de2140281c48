#!/usr/bin/env python3
"""Build the demo traces (traces/demo.jsonl) and the strict production schemas (schemas/<tool>.json).

Small agent sessions for replay through a small embedded model (SmolLM2-135M-Instruct): short tool lists,
short descriptions, and user turns that spell out every argument value so a 135M model can copy them. The
tools simplify BFCL's multi-turn APIs (ticket, file system, trading, travel, vehicle, messaging). Requests
carry loose parameter schemas, as agents usually send; schemas/ holds the stricter production schemas
(enums, bounds, patterns, no extra properties). Every recorded response is the production answer: one tool
call that validates against its schema file.

Standard library only; seeded with random.Random(7), so reruns are byte-identical.

    python scripts/make_demo_traces.py [--out-dir traces] [--schemas-dir schemas]
"""

from __future__ import annotations

import argparse
import json
import random
import string
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SEED = 7
N_SESSIONS = 68
MODEL = "gpt-4o-mini-2024-07-18"
EPOCH = 1767312000  # 2026-01-02T00:00:00Z
PROMPT_CHAR_BUDGET = 1550
SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"

# ---------------------------------------------------------------- tools
# name -> (description, {param: (type, description or None, strict constraints)}, required)
S, I, N, B = "string", "integer", "number", "boolean"  # noqa: E741 (short type aliases for the table below)
FILE = {"pattern": "^[^/]+$", "minLength": 1, "maxLength": 64}
AIRPORT = {"pattern": "^[A-Z]{3}$"}
DATE = {"pattern": r"^\d{4}-\d{2}-\d{2}$", "format": "date"}
DOORS = ["driver", "passenger", "rear_left", "rear_right"]
TOOLS = {
    # Names differ from every BFCL tool name on purpose: schemas/<name>.json applies to any trace that calls
    # <name>, and the example traces (BFCL) must keep their own schemas.
    # ticket system (BFCL TicketAPI)
    "list_tickets": (
        "List support tickets for a customer.",
        {
            "customer_id": (I, None, {"minimum": 1000, "maximum": 99999}),
            "status": (S, "open, pending or closed", {"enum": ["open", "pending", "closed"]}),
            "limit": (I, None, {"minimum": 1, "maximum": 50}),
        },
        ["customer_id", "status"],
    ),
    "file_ticket": (
        "Create a support ticket.",
        {
            "title": (S, None, {"minLength": 3, "maxLength": 80}),
            "description": (S, None, {"maxLength": 500}),
            "priority": (I, "Priority from 1 to 5", {"minimum": 1, "maximum": 5}),
        },
        ["title", "priority"],
    ),
    "close_support_ticket": (
        "Close a ticket.",
        {
            "ticket_id": (I, None, {"minimum": 1}),
        },
        ["ticket_id"],
    ),
    # file system (BFCL GorillaFileSystem: mv, grep, tail, mkdir)
    "move_file": (
        "Move a file into a folder.",
        {
            "source": (S, None, FILE),
            "destination": (S, None, FILE),
        },
        ["source", "destination"],
    ),
    "search_file": (
        "Search a file for a pattern.",
        {
            "file_name": (S, None, FILE),
            "pattern": (S, None, {"minLength": 1, "maxLength": 100}),
        },
        ["file_name", "pattern"],
    ),
    "tail_file": (
        "Show the last lines of a file.",
        {
            "file_name": (S, None, FILE),
            "lines": (I, None, {"minimum": 1, "maximum": 1000}),
        },
        ["file_name", "lines"],
    ),
    "make_directory": (
        "Create a folder.",
        {
            "dir_name": (S, None, {"pattern": "^[A-Za-z0-9_.-]+$", "maxLength": 64}),
        },
        ["dir_name"],
    ),
    # trading (BFCL TradingBot)
    "get_quote": (
        "Get the current price of a stock.",
        {
            "symbol": (S, None, {"pattern": "^[A-Z]{1,5}$"}),
        },
        ["symbol"],
    ),
    "submit_order": (
        "Place a stock order.",
        {
            "order_type": (S, "Buy or Sell", {"enum": ["Buy", "Sell"]}),
            "symbol": (S, None, {"pattern": "^[A-Z]{1,5}$"}),
            "price": (N, None, {"exclusiveMinimum": 0, "maximum": 100000}),
            "amount": (I, None, {"minimum": 1, "maximum": 10000}),
        },
        ["order_type", "symbol", "price", "amount"],
    ),
    "cancel_stock_order": (
        "Cancel an order.",
        {
            "order_id": (I, None, {"minimum": 1}),
        },
        ["order_id"],
    ),
    # travel (BFCL TravelAPI)
    "get_fare": (
        "Get the cost of a flight.",
        {
            "from_airport": (S, None, AIRPORT),
            "to_airport": (S, None, AIRPORT),
            "travel_date": (S, "YYYY-MM-DD", DATE),
            "travel_class": (S, "economy, business or first", {"enum": ["economy", "business", "first"]}),
        },
        ["from_airport", "to_airport", "travel_date", "travel_class"],
    ),
    "reserve_flight": (
        "Book a flight.",
        {
            "card_id": (S, None, {"pattern": "^card_[0-9]{4}$"}),
            "from_airport": (S, None, AIRPORT),
            "to_airport": (S, None, AIRPORT),
            "travel_date": (S, "YYYY-MM-DD", DATE),
        },
        ["card_id", "from_airport", "to_airport", "travel_date"],
    ),
    "cancel_reservation": (
        "Cancel a booking.",
        {
            "booking_id": (S, None, {"pattern": "^BK[0-9]{6}$"}),
        },
        ["booking_id"],
    ),
    # vehicle (BFCL VehicleControlAPI)
    "set_climate": (
        "Set the cabin temperature.",
        {
            "temperature": (N, None, {"minimum": 10, "maximum": 90}),
            "unit": (S, "celsius or fahrenheit", {"enum": ["celsius", "fahrenheit"]}),
            "fan_speed": (I, "Fan speed 0-100", {"minimum": 0, "maximum": 100}),
        },
        ["temperature", "unit"],
    ),
    "lock_doors": (
        "Lock or unlock doors.",
        {
            "lock": (B, "true to lock, false to unlock", {}),
            "doors": (
                "array",
                "Doors: driver, passenger, rear_left, rear_right",
                {
                    "items": {"type": "string", "enum": DOORS},
                    "minItems": 1,
                    "maxItems": 4,
                    "uniqueItems": True,
                },
            ),
        },
        ["lock", "doors"],
    ),
    "fill_fuel_tank": (
        "Add fuel in gallons.",
        {
            "fuel_amount": (N, None, {"exclusiveMinimum": 0, "maximum": 50}),
        },
        ["fuel_amount"],
    ),
    # messaging (BFCL MessageAPI)
    "message_user": (
        "Send a message to a user.",
        {
            "receiver_id": (S, "User ID like USR001", {"pattern": "^USR[0-9]{3}$"}),
            "message": (S, None, {"minLength": 1, "maxLength": 280}),
        },
        ["receiver_id", "message"],
    ),
    "search_sent_messages": (
        "Search sent messages.",
        {
            "keyword": (S, None, {"minLength": 1, "maxLength": 50}),
        },
        ["keyword"],
    ),
}
DOMAINS = {
    "support": ["list_tickets", "file_ticket", "close_support_ticket"],
    "files": ["move_file", "search_file", "tail_file", "make_directory"],
    "trading": ["get_quote", "submit_order", "cancel_stock_order"],
    "travel": ["get_fare", "reserve_flight", "cancel_reservation"],
    "vehicle": ["set_climate", "lock_doors", "fill_fuel_tank"],
    "messaging": ["message_user", "search_sent_messages"],
}
CUSTOMERS = {  # customer -> (display name, domains, traffic weight)
    "acme-bank": ("Acme Bank", ["trading", "support"], 40),
    "globex-health": ("Globex Health", ["files", "messaging", "support"], 25),
    "initech": ("Initech", ["travel", "files"], 20),
    "umbrella-retail": ("Umbrella Retail", ["vehicle", "messaging"], 15),
}

FILES = [
    "final_report.pdf",
    "budget.xlsx",
    "notes.txt",
    "server.log",
    "invoice_2291.pdf",
    "roadmap.md",
    "results.csv",
    "draft.docx",
    "error.log",
    "summary.txt",
]
FOLDERS = ["temp", "archive", "backup", "reports", "shared", "2025_q4"]
PATTERNS = ["budget", "error", "timeout", "revenue", "TODO", "deadline"]
SYMBOLS = ["NVDA", "AAPL", "MSFT", "TSLA", "AMZN", "GOOG", "META", "ORCL"]
AIRPORTS = ["SFO", "JFK", "LAX", "ORD", "SEA", "BOS", "ATL", "DEN", "MIA"]
TITLES = [
    ("Login fails", "User cannot log in after password reset"),
    ("Card declined", "Customer card declined at checkout"),
    ("Slow dashboard", "Dashboard takes 30 seconds to load"),
    ("Missing invoice", "Invoice for March is missing"),
    ("Refund request", "Customer asks for a refund of order 5521"),
]
MESSAGES = [
    "The meeting moved to 3pm",
    "Please review the Q4 budget",
    "Server maintenance tonight",
    "Lunch order is here",
    "Your report is approved",
]
KEYWORDS = ["budget", "meeting", "report", "server", "invoice"]
DONE = ["Done.", "Done.", "All set.", "Completed."]


def rand_id(rng: random.Random, n: int) -> str:
    alphabet = string.ascii_letters + string.digits
    return "".join(rng.choice(alphabet) for _ in range(n))


def dumps(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def request_tool(name: str) -> dict:
    """The loose schema an agent sends: types, short descriptions, required."""
    desc, params, required = TOOLS[name]
    props = {}
    for p, (t, d, c) in params.items():
        props[p] = {"type": t, "description": d} if d else {"type": t}
        if t == "array":
            props[p]["items"] = {"type": c["items"]["type"]}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": desc,
            "parameters": {"type": "object", "properties": props, "required": required},
        },
    }


def strict_schema(name: str) -> dict:
    """The production schema: the same parameters with enums, bounds, patterns and no extra properties."""
    desc, params, required = TOOLS[name]
    props = {p: {"type": t, **({"description": d} if d else {}), **c} for p, (t, d, c) in params.items()}
    return {
        "$schema": SCHEMA_DIALECT,
        "$id": f"https://schemas.toolaudit.dev/{name}.json",
        "title": name,
        "description": desc,
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": False,
    }


# ---------------------------------------------------------------- one user turn per tool
# Each returns (user text, arguments, tool result). `state` carries ids from earlier results in the session.


def turn_list_tickets(rng, state):
    cid, status, limit = (
        rng.randint(1000, 9999),
        rng.choice(["open", "pending", "closed"]),
        rng.choice([3, 5, 10]),
    )
    ids = sorted(rng.sample(range(4000, 4999), 2))
    state["tickets"] = ids
    text = rng.choice(
        [
            f"List the {limit} most recent {status} tickets for customer {cid}.",
            f"Show up to {limit} {status} tickets for customer {cid}.",
        ]
    )
    return text, {"customer_id": cid, "status": status, "limit": limit}, {"tickets": ids}


def turn_file_ticket(rng, state):
    (title, desc), prio = rng.choice(TITLES), rng.randint(1, 5)
    tid = rng.randint(5000, 5999)
    state.setdefault("tickets", []).append(tid)
    text = f"Create a ticket titled '{title}' with priority {prio} and description '{desc}'."
    return text, {"title": title, "description": desc, "priority": prio}, {"id": tid, "status": "open"}


def turn_close_support_ticket(rng, state):
    tid = rng.choice(state["tickets"]) if state.get("tickets") else rng.randint(4000, 5999)
    return f"Close ticket {tid}.", {"ticket_id": tid}, {"status": "closed"}


def turn_move_file(rng, state):
    f, d = rng.choice(FILES), rng.choice(FOLDERS)
    text = rng.choice([f"Move '{f}' to the '{d}' folder.", f"Put '{f}' into the '{d}' folder."])
    return text, {"source": f, "destination": d}, {"result": f"{d}/{f}"}


def turn_search_file(rng, state):
    f, p = rng.choice(FILES), rng.choice(PATTERNS)
    return (
        f"Search '{f}' for the word '{p}'.",
        {"file_name": f, "pattern": p},
        {"matching_lines": [f"line {rng.randint(2, 90)}: {p} ..."]},
    )


def turn_tail_file(rng, state):
    f, n = rng.choice(FILES), rng.choice([5, 10, 20, 50])
    return f"Show the last {n} lines of '{f}'.", {"file_name": f, "lines": n}, {"lines_returned": n}


def turn_make_directory(rng, state):
    d = rng.choice(FOLDERS)
    return f"Create a folder named '{d}'.", {"dir_name": d}, {"result": "created"}


def turn_get_quote(rng, state):
    sym = rng.choice(SYMBOLS)
    price = round(rng.uniform(20, 900), 2)
    state["last_symbol"], state["last_price"] = sym, price
    text = rng.choice([f"What is the current price of {sym}?", f"Get stock info for {sym}."])
    return text, {"symbol": sym}, {"symbol": sym, "price": price}


def turn_submit_order(rng, state):
    sym = state.get("last_symbol") or rng.choice(SYMBOLS)
    price = round(rng.uniform(20, 900), 1)
    side, amount = rng.choice(["Buy", "Sell"]), rng.choice([5, 10, 25, 50, 100])
    oid = rng.randint(12000, 12999)
    state["orders"] = state.get("orders", []) + [oid]
    return (
        f"{side} {amount} shares of {sym} at {price}.",
        {"order_type": side, "symbol": sym, "price": price, "amount": amount},
        {"order_id": oid, "status": "Pending"},
    )


def turn_cancel_stock_order(rng, state):
    oid = state["orders"][-1] if state.get("orders") else rng.randint(12000, 12999)
    return f"Cancel order {oid}.", {"order_id": oid}, {"status": "Cancelled"}


def flight(rng):
    a, b = rng.sample(AIRPORTS, 2)
    return a, b, f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def turn_get_fare(rng, state):
    a, b, d = flight(rng)
    cls = rng.choice(["economy", "business", "first"])
    state["flight"] = (a, b, d)
    return (
        f"How much is {'an' if cls == 'economy' else 'a'} {cls} flight from {a} to {b} on {d}?",
        {"from_airport": a, "to_airport": b, "travel_date": d, "travel_class": cls},
        {"travel_cost": round(rng.uniform(120, 2400), 2)},
    )


def turn_reserve_flight(rng, state):
    a, b, d = state.get("flight") or flight(rng)
    card = f"card_{rng.randint(1000, 9999)}"
    bid = f"BK{rng.randint(100000, 999999)}"
    state["booking"] = bid
    return (
        f"Book the flight from {a} to {b} on {d} with card {card}.",
        {"card_id": card, "from_airport": a, "to_airport": b, "travel_date": d},
        {"booking_id": bid, "status": "confirmed"},
    )


def turn_cancel_reservation(rng, state):
    bid = state.get("booking") or f"BK{rng.randint(100000, 999999)}"
    return f"Cancel booking {bid}.", {"booking_id": bid}, {"cancel_status": True}


def turn_set_climate(rng, state):
    unit = rng.choice(["celsius", "fahrenheit"])
    temp = rng.randint(18, 25) if unit == "celsius" else rng.randint(64, 78)
    fan = rng.choice([20, 40, 50, 60, 80])
    return (
        f"Set the cabin to {temp} degrees {unit} with fan speed {fan}.",
        {"temperature": temp, "unit": unit, "fan_speed": fan},
        {"currentTemperature": temp, "fanSpeed": fan},
    )


def turn_lock_doors(rng, state):
    lock = rng.random() < 0.6
    doors = rng.sample(DOORS, rng.randint(1, 2))
    verb = "Lock" if lock else "Unlock"
    names = " and ".join(doors)
    text = f"{verb} the {names} door{'s' if len(doors) > 1 else ''}."
    return text, {"lock": lock, "doors": doors}, {"lockStatus": "locked" if lock else "unlocked"}


def turn_fill_fuel_tank(rng, state):
    amount = rng.choice([5, 10, 12.5, 15, 20, 7.5])
    return f"Add {amount} gallons of fuel.", {"fuel_amount": amount}, {"fuelLevel": round(amount + 10.0, 1)}


def turn_message_user(rng, state):
    user, msg = f"USR{rng.randint(1, 120):03d}", rng.choice(MESSAGES)
    return (
        f"Send '{msg}' to user {user}.",
        {"receiver_id": user, "message": msg},
        {"sent_status": True, "message_id": rng.randint(1000, 9999)},
    )


def turn_search_sent_messages(rng, state):
    kw = rng.choice(KEYWORDS)
    return (
        f"Find my sent messages that mention '{kw}'.",
        {"keyword": kw},
        {"results": [{"receiver_id": f"USR{rng.randint(1, 120):03d}", "message": f"... {kw} ..."}]},
    )


TURNS = {name: globals()[f"turn_{name}"] for name in TOOLS}


# ---------------------------------------------------------------- sessions


def prompt_chars(request: dict) -> int:
    """Characters a chat template renders (tool JSON, contents, tool calls): SmolLM2's tokenizer gives at most
    ~0.48 tokens per such character on these prompts, so the budget keeps every prompt under ~700 tokens."""
    n = len(dumps([t["function"] for t in request["tools"]]))
    for m in request["messages"]:
        n += 12 + len(m.get("content") or "")
        for tc in m.get("tool_calls") or []:
            n += 20 + len(tc["function"]["name"]) + len(tc["function"]["arguments"])
    return n


def build(rng: random.Random) -> list[dict]:
    records = []
    names = list(CUSTOMERS)
    weights = [CUSTOMERS[c][2] for c in names]
    fingerprint = "fp_" + "".join(rng.choice("0123456789abcdef") for _ in range(10))
    for s in range(N_SESSIONS):
        customer = names[s % len(names)] if s < len(names) else rng.choices(names, weights)[0]
        display, domains, _ = CUSTOMERS[customer]
        domain = domains[s % len(domains)] if s < 16 else rng.choice(domains)
        pool = DOMAINS[domain]
        tools = sorted(rng.sample(pool, min(len(pool), rng.randint(2, 4))), key=pool.index)
        n_calls = rng.randint(3, 5)
        sid = f"demo-{rng.getrandbits(40):010x}"
        system = {
            "role": "system",
            "content": f"You are {display}'s assistant. Answer each request with one tool call.",
        }
        history, state = [system], {}
        t = EPOCH + rng.randint(0, 8 * 3600)
        for i in range(n_calls):
            name = tools[i % len(tools)] if i < len(tools) else rng.choice(tools)
            text, args, result = TURNS[name](rng, state)
            user = {"role": "user", "content": text}
            call_id = "call_" + rand_id(rng, 24)
            arguments = dumps(args)
            request = {
                "model": MODEL,
                "messages": history + [user],
                "tools": [request_tool(n) for n in tools],
                "tool_choice": "auto",
                "temperature": 0,
                "metadata": {"session_id": sid, "customer": customer, "call_index": str(i)},
            }
            if i >= 3 and prompt_chars(request) > PROMPT_CHAR_BUDGET:
                break  # keep every prompt compact: the session ends a call early
            prompt_tokens = len(dumps(request["messages"]) + dumps(request["tools"])) // 4
            completion_tokens = len(arguments) // 3 + 8
            tool_call = {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            response = {
                "id": "chatcmpl-" + rand_id(rng, 29),
                "object": "chat.completion",
                "created": t,
                "model": MODEL,
                "system_fingerprint": fingerprint,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": None, "tool_calls": [tool_call]},
                        "finish_reason": "tool_calls",
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
            }
            records.append({"request": request, "response": response})
            history = history + [
                user,
                {"role": "assistant", "content": None, "tool_calls": [tool_call]},
                {"role": "tool", "tool_call_id": call_id, "content": dumps(result)},
                {"role": "assistant", "content": rng.choice(DONE)},
            ]
            t += rng.randint(5, 60)
    records.sort(key=lambda r: (r["response"]["created"], r["request"]["metadata"]["session_id"]))
    return records


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", type=Path, default=REPO / "traces", help="where demo.jsonl goes")
    parser.add_argument("--schemas-dir", type=Path, default=REPO / "schemas", help="where <tool>.json go")
    ns = parser.parse_args(argv)
    schemas_dir = ns.schemas_dir
    ns.out_dir.mkdir(parents=True, exist_ok=True)
    schemas_dir.mkdir(parents=True, exist_ok=True)
    records = build(random.Random(SEED))
    with open(ns.out_dir / "demo.jsonl", "w", encoding="utf-8", newline="\n") as f:
        f.writelines(dumps(r) + "\n" for r in records)
    used = sorted({t["function"]["name"] for r in records for t in r["request"]["tools"]})
    for name in used:
        with open(schemas_dir / f"{name}.json", "w", encoding="utf-8", newline="\n") as f:
            json.dump(strict_schema(name), f, ensure_ascii=False, indent=2)
            f.write("\n")
    sessions = {r["request"]["metadata"]["session_id"] for r in records}
    print(
        f"{len(sessions)} sessions, {len(records)} calls, {len(used)} tools -> {ns.out_dir / 'demo.jsonl'}, "
        f"{schemas_dir}"
    )


if __name__ == "__main__":
    main()
