"""The `echo` engine's registration: its own `[paths.NAME]` keys, checked before anything loads, and its
capabilities. Importing this module imports nothing heavy: toolaudit reads it to validate paths.toml.

Keys: `pick = "first" | "last"` (which of the request's tools it calls; default "first") and `noisy = true`
(print and log like a real engine does while it loads and decodes: toolaudit must keep that off the terminal).
"""

from __future__ import annotations

from dataclasses import dataclass

from toolaudit.engines import Capabilities, EngineSpec
from toolaudit.engines.options import key


@dataclass(frozen=True)
class EchoOptions:
    """The echo engine's keys: toolaudit checks a table against them (types, allowed values) and fills defaults."""

    pick: str = key("first", allowed=("first", "last"), doc="which of the request's tools it calls")
    noisy: bool = key(False, doc="print and log while loading and decoding, as real engines do")


CAPABILITIES = Capabilities(in_process=True)
ENGINE = EngineSpec(name="echo", factory="toolaudit_echo_engine.engine:EchoEngine", options=EchoOptions,
                    capabilities=CAPABILITIES, store_defaults=False)
KEYS = ENGINE.keys
