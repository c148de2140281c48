"""jsonschema validators whose pattern keywords match with `patterns` (time-boxed) instead of Python's `re`.

jsonschema calls `re.search` for `pattern`, `patternProperties` and the `additionalProperties` that depends on
them; `extend` swaps those three keywords for versions that go through `patterns.search`, which raises
`PatternTimeout` when a hostile pattern meets a hostile string. `unevaluatedProperties` also matches
`patternProperties` internally (deep in jsonschema's annotation walk); a schema that combines the two is not
validated at all (`unsupported_reason`), rather than validated with an unbounded matcher.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

from jsonschema.exceptions import ValidationError
from jsonschema.validators import extend

from toolaudit.validate.patterns import search, shorten, untimed_reason

_EXCERPT = 120


def _pattern(validator: Any, patrn: str, instance: Any, schema: dict) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not search(patrn, instance):
        shown = instance if len(instance) <= _EXCERPT else instance[:_EXCERPT] + f"... ({len(instance)} chars)"
        yield ValidationError(f"{shown!r} does not match {shorten(patrn)!r}")


def _pattern_properties(validator: Any, patterns: dict, instance: Any, schema: dict) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for patrn, subschema in patterns.items():
        for key, value in instance.items():
            if search(patrn, key):
                yield from validator.descend(value, subschema, path=key, schema_path=patrn)


def _extras(instance: dict, schema: dict) -> list:
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    return [key for key in instance
            if key not in properties and not any(search(p, key) for p in patterns)]


def _additional_properties(validator: Any, extra: Any, instance: Any, schema: dict) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    extras = _extras(instance, schema)
    if validator.is_type(extra, "object"):
        for key in extras:
            yield from validator.descend(instance[key], extra, path=key)
    elif not extra and extras:
        names = ", ".join(repr(k) for k in sorted(extras, key=str))
        if "patternProperties" in schema:
            verb = "does" if len(extras) == 1 else "do"
            regexes = ", ".join(repr(p) for p in sorted(schema["patternProperties"]))
            yield ValidationError(f"{names} {verb} not match any of the regexes: {regexes}")
        else:
            verb = "was" if len(extras) == 1 else "were"
            yield ValidationError(f"Additional properties are not allowed ({names} {verb} unexpected)")


@functools.lru_cache(maxsize=16)
def safe_class(cls: type) -> type:
    """`cls` (a jsonschema dialect) with the pattern keywords matched by `patterns.search`."""
    return extend(cls, validators={"pattern": _pattern, "patternProperties": _pattern_properties,
                                   "additionalProperties": _additional_properties})


def unsupported_reason(schema: Any) -> str | None:
    """Why the schema cannot be validated with bounded pattern matching, or None. Walks iteratively."""
    seen_unevaluated = seen_patterns = False
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            seen_unevaluated |= "unevaluatedProperties" in node
            found = node.get("patternProperties")
            seen_patterns |= isinstance(found, dict) and bool(found)
            for pattern in [node.get("pattern"), *(found if isinstance(found, dict) else ())]:
                reason = untimed_reason(pattern) if isinstance(pattern, str) else None
                if reason:
                    return f"{reason}; validity of this tool's calls is unknown"
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    if seen_unevaluated and seen_patterns:
        return ("unevaluatedProperties combined with patternProperties is not validated (its pattern matching "
                "cannot be time-boxed); validity of this tool's calls is unknown")
    return None
