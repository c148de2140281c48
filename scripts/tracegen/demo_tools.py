"""The demo's tool catalogue: 18 small tools in 6 domains, the loose schemas requests carry, the strict ones.

The tools simplify BFCL's multi-turn APIs (ticket, file system, trading, travel, vehicle, messaging) so that a
135M model can call them: short descriptions, few parameters. A request offers the loose schema agents usually
send (types, a few descriptions, required); `schemas/<tool>.json` holds the production schema with enums,
bounds, patterns and no extra properties, which every recorded answer satisfies.
"""

from __future__ import annotations

from .chat import function_tool

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"

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


def request_tool(name: str) -> dict:
    """The loose schema an agent sends: types, short descriptions, required."""
    desc, params, required = TOOLS[name]
    props = {}
    for p, (t, d, c) in params.items():
        props[p] = {"type": t, "description": d} if d else {"type": t}
        if t == "array":
            props[p]["items"] = {"type": c["items"]["type"]}
    return function_tool(name, desc, {"type": "object", "properties": props, "required": required})


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
