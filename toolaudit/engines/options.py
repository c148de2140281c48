"""Typed engine options: an engine declares its own `[paths.NAME]` keys as a frozen dataclass whose fields carry
their types, defaults and allowed values (`key(...)`); the registry validates a table against it and fills the
defaults, with one message format for every engine and plug-in ("paths.NAME: KEY must be ... (got VALUE)"), and
engines read fields (`spec.read(path.options).threads`), not dict keys.

    @dataclass(frozen=True)
    class EchoOptions:
        delay_s: float = key(0.0, low=0, doc="seconds to wait per request")
        mode: str = key("last", allowed=("last", "first"))

    ENGINE = EngineSpec(name="echo", factory="...", options=EchoOptions, check=None)

A field's type is its annotation: `bool`, `int`, `float`, `str`, `dict` (a TOML table), each optionally
`| None` (None: the engine decides, e.g. by device). Rules a single field cannot say (one key's value
depending on another, or on a common key such as dtype) go in the spec's `check`. No heavy imports here:
paths.toml is read before any engine loads.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass
from typing import Any

from toolaudit import ConfigError

Fail = Callable[[str, str], ConfigError]
META = "toolaudit"


@dataclass(frozen=True)
class Rule:
    """What a key allows besides its type: one of `allowed`, or a number within [low, high] (open ends where
    said); `what` replaces the type's name in the message ("a table of generate() keyword arguments")."""

    allowed: tuple[Any, ...] | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    what: str | None = None
    doc: str = ""


def key(default: Any = MISSING, *, allowed: tuple[Any, ...] | None = None, low: float | None = None,
        high: float | None = None, low_open: bool = False, high_open: bool = False, what: str | None = None,
        doc: str = "") -> Any:
    """A dataclass field declaring one engine key (a dict default is copied per instance)."""
    rule = Rule(allowed, low, high, low_open, high_open, what, doc)
    if isinstance(default, dict):
        return dataclasses.field(default_factory=lambda: dict(default), metadata={META: rule})
    return dataclasses.field(default=default, metadata={META: rule})


def keys_of(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def defaults_of(cls: type) -> dict[str, Any]:
    return {f.name: f.default_factory() if f.default_factory is not MISSING else f.default
            for f in dataclasses.fields(cls)}


def parse(cls: type, table: Mapping[str, Any], fail: Fail) -> Any:
    """The typed options of a `[paths.NAME]` table: every key of `cls` the table sets, checked; the rest default."""
    hints = typing.get_type_hints(cls)
    given = {}
    for f in dataclasses.fields(cls):
        if f.name in table:
            given[f.name] = check(f.name, table[f.name], hints[f.name], f.metadata.get(META, Rule()), fail)
    return cls(**given)


def stored(options: Any, table: Mapping[str, Any], fill_defaults: bool) -> dict[str, Any]:
    """The options as `PathConfig.options` holds them (and a run stores and fingerprints them): every key with
    its default filled in, or only the keys the table set, as it set them (the engine reads them typed)."""
    names = [f.name for f in dataclasses.fields(options)]
    if fill_defaults:
        return {name: getattr(options, name) for name in names}
    return {name: table[name] for name in names if name in table}


def read(cls: type, options: Mapping[str, Any]) -> Any:
    """The typed options of a `PathConfig.options` dict (validated when the path was read; a path built in code
    may leave keys out: they default). Keys that are not the engine's are ignored."""
    names = keys_of(cls)
    return cls(**{k: v for k, v in options.items() if k in names})


def check(name: str, value: Any, hint: Any, rule: Rule, fail: Fail) -> Any:
    """`value` as the key's type allows it (an int where a float is asked becomes a float), else `fail`."""
    optional, kind = _kind(hint)
    if value is None and optional:
        return None
    if rule.allowed is not None:
        if value not in rule.allowed or isinstance(value, bool) != (kind is bool):
            raise fail(name, f"must be one of {', '.join(map(str, rule.allowed))} (got {value!r})")
        return value
    if kind is bool:
        if not isinstance(value, bool):
            raise fail(name, f"must be true or false (got {value!r})")
        return value
    if kind in (int, float):
        ok = not isinstance(value, bool) and isinstance(value, (int, float) if kind is float else int)
        if not ok or not _within(value, rule):
            raise fail(name, f"must be {rule.what or _number_words(kind, rule)} (got {value!r})")
        return float(value) if kind is float else value
    if kind is dict:
        if not isinstance(value, dict):
            raise fail(name, f"must be {rule.what or 'a table'}")
        return dict(value)
    if kind is str and not isinstance(value, str):
        raise fail(name, f"must be {rule.what or 'a string'} (got {value!r})")
    return value


def _kind(hint: Any) -> tuple[bool, Any]:
    """(None allowed, the base type) of an annotation such as `int | None`."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return True, (typing.get_origin(args[0]) or args[0]) if len(args) == 1 else object
    return False, typing.get_origin(hint) or hint


def _within(value: float, r: Rule) -> bool:
    if r.low is not None and (value < r.low or (r.low_open and value == r.low)):
        return False
    return r.high is None or not (value > r.high or (r.high_open and value == r.high))


def _number_words(kind: type, r: Rule) -> str:
    """The allowed numbers in words, as every engine's messages say them."""
    if kind is int:
        if r.low == 1 and r.high is None:
            return "a positive integer"
        if r.low is not None and r.high is not None:
            return f"an integer from {r.low:g} to {r.high:g}"
        if r.low is not None:
            return f"an integer {'>' if r.low_open else '>='} {r.low:g}"
        return "an integer"
    if r.low is not None and r.high is not None:
        return f"a number in {'(' if r.low_open else '['}{r.low:g}, {r.high:g}{')' if r.high_open else ']'}"
    if r.low is not None:
        return f"a number {'>' if r.low_open else '>='} {r.low:g}"
    return "a number"
