"""A compiled fast path for the JSON Schema subset that tool schemas use, in front of `jsonschema`.

Tool-parameter schemas are nearly always plain `type`/`properties`/`required`/`enum`/`items` trees, and
jsonschema's general machinery (resolver, evolve, per-keyword dispatch) costs ~10 µs per call. `compile_fast`
turns such a schema into nested closures once; it answers only "definitely valid". Anything it cannot
decide exactly (an unknown keyword, a non-string enum) makes it return None at compile time, and an invalid
instance is always re-checked by jsonschema, which alone produces the error messages. So the verdict is
jsonschema's; only the common "valid" answer is fast.

Patterns are untrusted (they come from recorded requests): they are matched by `patterns.search`, time-boxed,
never by Python's backtracking `re`; running out of budget raises `PatternTimeout` to the caller.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from toolaudit.validate.patterns import PatternError, compile_pattern, search

Check = Callable[[Any], bool]

# Keywords with no effect on validity (format is annotation-only unless a format checker is enabled).
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$schema", "$id", "$comment",
                          "format", "deprecated", "readOnly", "writeOnly", "x-order"})
_SUPPORTED = _ANNOTATIONS | {"type", "properties", "required", "enum", "const", "items", "minimum", "maximum",
                             "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "minItems",
                             "maxItems", "additionalProperties", "pattern", "uniqueItems"}


class _Unsupported(Exception):
    pass


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


_TYPE_CHECKS: dict[str, Check] = {
    "object": lambda x: isinstance(x, dict),
    "array": lambda x: isinstance(x, list),
    "string": lambda x: isinstance(x, str),
    "boolean": lambda x: isinstance(x, bool),
    "null": lambda x: x is None,
    "number": _is_number,
    "integer": lambda x: (isinstance(x, int) and not isinstance(x, bool))
    or (isinstance(x, float) and x.is_integer()),
}


def compile_fast(schema: Any) -> Check | None:
    """A function that returns True only for instances jsonschema would accept; None if out of subset."""
    try:
        return _compile(schema)
    except _Unsupported:
        return None


def _compile(schema: Any) -> Check:
    if schema is True or schema == {}:
        return lambda x: True
    if not isinstance(schema, dict) or not set(schema) <= _SUPPORTED:
        raise _Unsupported
    checks: list[Check] = []
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not all(isinstance(t, str) and t in _TYPE_CHECKS for t in types):
            raise _Unsupported
        fns = [_TYPE_CHECKS[t] for t in types]
        checks.append(fns[0] if len(fns) == 1 else (lambda x, fns=fns: any(f(x) for f in fns)))
    if "enum" in schema:
        values = schema["enum"]
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise _Unsupported
        allowed = frozenset(values)
        checks.append(lambda x: isinstance(x, str) and x in allowed)
    if "const" in schema:
        const = schema["const"]
        if not isinstance(const, str):
            raise _Unsupported
        checks.append(lambda x: x == const and isinstance(x, str))
    checks.extend(_numeric(schema))
    checks.extend(_string(schema))
    checks.extend(_array(schema))
    checks.extend(_object(schema))
    if not checks:
        return lambda x: True
    if len(checks) == 1:
        return checks[0]
    return lambda x: all(check(x) for check in checks)


def _numeric(schema: dict) -> list[Check]:
    out: list[Check] = []
    for key, ok in (("minimum", lambda x, b: x >= b), ("maximum", lambda x, b: x <= b),
                    ("exclusiveMinimum", lambda x, b: x > b), ("exclusiveMaximum", lambda x, b: x < b)):
        if key in schema:
            bound = schema[key]
            if not _is_number(bound):
                raise _Unsupported
            out.append(lambda x, b=bound, ok=ok: not _is_number(x) or ok(x, b))
    return out


def _string(schema: dict) -> list[Check]:
    out: list[Check] = []
    if "minLength" in schema:
        n = schema["minLength"]
        out.append(lambda x: not isinstance(x, str) or len(x) >= n)
    if "maxLength" in schema:
        n2 = schema["maxLength"]
        out.append(lambda x: not isinstance(x, str) or len(x) <= n2)
    if "pattern" in schema:
        pattern = schema["pattern"]
        try:
            compile_pattern(pattern)
        except PatternError:
            raise _Unsupported from None
        out.append(lambda x: not isinstance(x, str) or search(pattern, x))
    return out


def _array(schema: dict) -> list[Check]:
    out: list[Check] = []
    if "items" in schema:
        if not isinstance(schema["items"], (dict, bool)):
            raise _Unsupported  # tuple-style items arrays are left to jsonschema
        item = _compile(schema["items"]) if schema["items"] is not False else (lambda x: False)
        out.append(lambda x: not isinstance(x, list) or all(item(v) for v in x))
    if "minItems" in schema:
        n = schema["minItems"]
        out.append(lambda x: not isinstance(x, list) or len(x) >= n)
    if "maxItems" in schema:
        n2 = schema["maxItems"]
        out.append(lambda x: not isinstance(x, list) or len(x) <= n2)
    if schema.get("uniqueItems"):
        raise _Unsupported  # 1 == 1.0 == True subtleties: leave to jsonschema
    return out


def _object(schema: dict) -> list[Check]:
    out: list[Check] = []
    props = schema.get("properties", {})
    if not isinstance(props, dict):
        raise _Unsupported
    compiled = {name: _compile(sub) for name, sub in props.items()}
    required = schema.get("required", [])
    if not isinstance(required, list):
        raise _Unsupported
    extra = schema.get("additionalProperties", True)
    extra_check = None if extra is True else (lambda x: False) if extra is False else _compile(extra)

    def check(x: Any) -> bool:
        if not isinstance(x, dict):
            return True
        for name in required:
            if name not in x:
                return False
        for key, value in x.items():
            sub = compiled.get(key)
            if sub is not None:
                if not sub(value):
                    return False
            elif extra_check is not None and not extra_check(value):
                return False
        return True

    if compiled or required or extra_check is not None:
        out.append(check)
    return out
