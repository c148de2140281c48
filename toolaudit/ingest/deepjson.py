"""JSON encoding that survives any nesting depth.

orjson refuses to encode values nested deeper than 254 levels, yet parses up to 1024, and Python's `repr` and
`json` recurse (RecursionError near 1000). Model output nested 900 levels deep is hostile but legal input: this
encoder is iterative, so canonical signatures and stored JSON never crash on it.
"""

from __future__ import annotations

from typing import Any

import orjson


def dumps(value: Any, sort_keys: bool = True) -> str:
    """Compact JSON of `value` (sorted keys by default); non-JSON leaves are encoded as their repr string."""
    out: list[str] = []
    stack: list[tuple[bool, Any]] = [(False, value)]  # (is literal text, item)
    while stack:
        literal, item = stack.pop()
        if literal:
            out.append(item)
        elif isinstance(item, dict):
            keys = list(item)
            if sort_keys:
                keys.sort(key=str)
            todo: list[tuple[bool, Any]] = [(True, "{")]
            for i, key in enumerate(keys):
                todo.append((True, ("," if i else "") + _scalar(str(key)) + ":"))
                todo.append((False, item[key]))
            todo.append((True, "}"))
            stack.extend(reversed(todo))
        elif isinstance(item, (list, tuple)):
            todo = [(True, "[")]
            for i, element in enumerate(item):
                if i:
                    todo.append((True, ","))
                todo.append((False, element))
            todo.append((True, "]"))
            stack.extend(reversed(todo))
        else:
            out.append(_scalar(item))
    return "".join(out)


def _scalar(item: Any) -> str:
    try:
        return orjson.dumps(item).decode()
    except TypeError:
        return orjson.dumps(repr(item)).decode()
