"""A tiny validator for BFCL-style schemas, used only to decide an injected drift's expected kind.

BFCL's schemas use non-JSON-Schema types: dict -> object, float -> number, tuple -> array, any -> unconstrained;
`optional` is ignored. A change that fails this check is expected as `schema_broken`, else `arguments_changed`.
"""

from __future__ import annotations

TYPE_CHECKS = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "dict": lambda v: isinstance(v, dict),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "tuple": lambda v: isinstance(v, list),
}


def is_valid(value, schema: dict) -> bool:
    t = schema.get("type")
    if t in TYPE_CHECKS and not TYPE_CHECKS[t](value):
        return False
    if "enum" in schema and value not in schema["enum"]:
        return False
    if isinstance(value, dict) and t in ("dict", "object"):
        props = schema.get("properties", {})
        if any(r not in value for r in schema.get("required", [])):
            return False
        return all(is_valid(v, props[k]) for k, v in value.items() if k in props)
    if isinstance(value, list) and "items" in schema:
        return all(is_valid(v, schema["items"]) for v in value)
    return True
