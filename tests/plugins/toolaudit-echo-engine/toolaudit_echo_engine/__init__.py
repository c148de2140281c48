"""The `echo` engine's registration: its own `[paths.NAME]` keys, checked before anything loads, and its
capabilities. Importing this module imports nothing heavy: toolaudit reads it to validate paths.toml.

Keys: `pick = "first" | "last"` (which of the request's tools it calls; default "first") and `noisy = true`
(print and log like a real engine does while it loads and decodes: toolaudit must keep that off the terminal).
"""

from __future__ import annotations

from typing import Any, Callable

from toolaudit.engines import Capabilities, EngineSpec

KEYS = frozenset({"pick", "noisy"})


def parse_options(table: dict[str, Any], fail: Callable[[str, str], Exception]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if "pick" in table:
        if table["pick"] not in ("first", "last"):
            raise fail("pick", f"must be first or last (got {table['pick']!r})")
        options["pick"] = table["pick"]
    if "noisy" in table:
        if not isinstance(table["noisy"], bool):
            raise fail("noisy", f"must be true or false (got {table['noisy']!r})")
        options["noisy"] = table["noisy"]
    return options


CAPABILITIES = Capabilities(in_process=True)
ENGINE = EngineSpec(name="echo", factory="toolaudit_echo_engine.engine:EchoEngine", keys=KEYS,
                    parse_options=parse_options, capabilities=CAPABILITIES)
