"""One user turn per demo tool: the user's words, the call's arguments and the tool's result.

Each turn spells out every argument value in the user text, so a small model can copy it. `state` carries ids
from earlier results in the session (a ticket filed, then closed; a quote, then an order for that symbol), as
real sessions do.
"""

from __future__ import annotations

from .demo_tools import DOORS

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


# Each turn returns (user text, arguments, tool result).
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


TURNS = {
    "list_tickets": turn_list_tickets,
    "file_ticket": turn_file_ticket,
    "close_support_ticket": turn_close_support_ticket,
    "move_file": turn_move_file,
    "search_file": turn_search_file,
    "tail_file": turn_tail_file,
    "make_directory": turn_make_directory,
    "get_quote": turn_get_quote,
    "submit_order": turn_submit_order,
    "cancel_stock_order": turn_cancel_stock_order,
    "get_fare": turn_get_fare,
    "reserve_flight": turn_reserve_flight,
    "cancel_reservation": turn_cancel_reservation,
    "set_climate": turn_set_climate,
    "lock_doors": turn_lock_doors,
    "fill_fuel_tank": turn_fill_fuel_tank,
    "message_user": turn_message_user,
    "search_sent_messages": turn_search_sent_messages,
}
