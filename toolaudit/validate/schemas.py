"""Tool parameter schemas: where they come from, how messy ones are repaired, and validating arguments.

Schemas come from the request's `tools`, or from `schemas/<tool_name>.json`, which wins: teams keep stricter
production schemas than the ones they send to the model. Real schemas are messy (BFCL writes `dict`,
`float`, `optional: true`), so they are normalised to JSON Schema with a recorded warning rather than
rejected; a schema that is still invalid is reported on its CompiledSchema and the run goes on. Only a schema
*file* that is not JSON raises, because that is configuration the user must fix.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from jsonschema import Draft6Validator, Draft7Validator, Draft201909Validator, Draft202012Validator
from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for

from toolaudit import TraceError
from toolaudit.ingest import deepjson
from toolaudit.validate.fastpath import compile_fast
from toolaudit.validate.keywords import safe_class, unsupported_reason
from toolaudit.validate.patterns import DEFAULT_BUDGET_S, PatternTimeout, budget, shorten

# BFCL and Python-flavoured type names -> JSON Schema. Looked up after lower-casing ("String" -> "string").
_TYPE_ALIASES = {
    "dict": "object",
    "float": "number",
    "tuple": "array",
    "list": "array",
    "int": "integer",
    "str": "string",
    "bool": "boolean",
}
_JSON_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_ONE = ("items", "additionalProperties", "not", "contains")
_MEMO_SIZE = 4096
_MAX_TIMEOUTS = 3  # a schema whose patterns ran out of budget this often is no longer used in the run


def _normalize_type(value: Any, where: str, warnings: list[str]) -> Any:
    """Returns the JSON Schema type, or None to drop the constraint (`any`)."""
    if isinstance(value, list):
        out = [_normalize_type(v, where, warnings) for v in value]
        return None if None in out else out
    if not isinstance(value, str) or value in _JSON_TYPES:
        return value
    lowered = value.lower()
    if lowered == "any":
        warnings.append(f"{where}: type 'any' dropped (no type constraint)")
        return None
    new = _TYPE_ALIASES.get(lowered, lowered)
    if new in _JSON_TYPES:
        warnings.append(f"{where}: type '{value}' normalised to '{new}'")
        return new
    return value  # unknown: left for check_schema to report


def _truthy(flag: Any) -> bool:
    return flag is True or (isinstance(flag, str) and flag.lower() == "true")  # BFCL writes "True" too


def _normalize(schema: Any, where: str, warnings: list[str]) -> Any:
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)  # shallow copy; nested schemas are rebuilt below, so the input is never mutated
    if "type" in out:
        new_type = _normalize_type(out["type"], where, warnings)
        if new_type is None:
            del out["type"]
        else:
            out["type"] = new_type
    if "optional" in out:  # not JSON Schema; the parent drops an optional property from its `required`
        warnings.append(f"{where}: 'optional: {deepjson.dumps(out.pop('optional'))}' flag removed")
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {
                name: _normalize(sub, f"{where}.{key}.{name}", warnings) for name, sub in out[key].items()
            }
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_normalize(sub, f"{where}.{key}[{i}]", warnings) for i, sub in enumerate(out[key])]
    for key in _SUBSCHEMA_ONE:
        if isinstance(out.get(key), (dict, list)):
            sub = out[key]
            out[key] = (
                _normalize(sub, f"{where}.{key}", warnings)
                if isinstance(sub, dict)
                else [_normalize(s, f"{where}.{key}[{i}]", warnings) for i, s in enumerate(sub)]
            )
    properties, required = schema.get("properties"), schema.get("required")
    if isinstance(properties, dict) and isinstance(required, list):
        optional = {
            n for n, sub in properties.items() if isinstance(sub, dict) and _truthy(sub.get("optional"))
        }
        if isinstance(schema.get("optional"), list):  # BFCL also lists optional names on the object itself
            optional.update(n for n in schema["optional"] if isinstance(n, str))
        if optional.intersection(required):
            out["required"] = [r for r in required if r not in optional]
            warnings.append(f"{where}.required: optional {sorted(optional.intersection(required))} removed")
    return out


def normalize_schema(schema: dict, root: str = "parameters") -> tuple[dict, list[str]]:
    """BFCL-style schema -> (JSON Schema, warnings). `dict`->`object`, `float`->`number`, `tuple`->`array`,
    `any` drops the type, capitalised names are lower-cased, `optional` flags are removed. Input untouched."""
    warnings: list[str] = []
    return _normalize(schema, root, warnings), warnings


def _has_nan(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_has_nan(v) for v in value.values())
    return isinstance(value, list) and any(_has_nan(v) for v in value)


def _error_path(path: Any) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else str(part)
    return out


def _failure(exc: Exception) -> str:
    """Why applying a schema failed, in words (a RecursionError's message says nothing about the schema)."""
    if isinstance(exc, RecursionError):
        return ("it recurses past Python's recursion limit (a `$ref` cycle that never reaches a schema, or "
                "nesting too deep)")
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return shorten(text, 300)


_FAST_DIALECTS = (Draft202012Validator, Draft201909Validator, Draft7Validator, Draft6Validator)


@dataclass
class CompiledSchema:
    """A normalised schema with its validator. `invalid_reason` set means validity cannot be judged."""

    tool_name: str
    schema: Any
    source: str  # "file:<path>" or "request"
    warnings: list[str] = field(default_factory=list)
    invalid_reason: str | None = None
    _validator: Any = field(default=None, repr=False, compare=False)
    _memo: dict = field(default_factory=dict, repr=False, compare=False)
    _fast: Any = field(default=None, repr=False, compare=False)  # schema_fastpath: True = valid, else jsonschema
    budget_s: float = field(default=DEFAULT_BUDGET_S, repr=False, compare=False)
    timeouts: int = field(default=0, repr=False, compare=False)
    # (severity, message) for the caller to record as schema issues: "timeout" (a pattern that ran out of its
    # validation budget), "invalid" (the schema failed while applied: a `$ref` cycle, an unresolvable `$ref`)
    notes: list[tuple[str, str]] = field(default_factory=list, repr=False, compare=False)

    def errors(self, arguments: Any) -> list[str] | None:
        """None when validity cannot be judged (invalid schema, a pattern out of budget), [] when the arguments
        are valid, else one message per error.

        Baseline and candidate usually send identical arguments, so results are memoised by canonical JSON.
        orjson writes NaN as null, so arguments holding NaN are not memoised (NaN and null validate apart).
        Pattern matching of one call shares `budget_s` seconds (see `patterns`); a schema that runs out
        `_MAX_TIMEOUTS` times is not used again, so hostile input costs a run seconds, not hours. A schema that
        fails while applied (a `$ref` cycle recurses without end, a `$ref` to a URL is never fetched) is the
        schema's fault, not the arguments': it becomes invalid, with a note, and is not used again.
        """
        if self._validator is None or self.timeouts >= _MAX_TIMEOUTS:
            return None
        try:
            key = orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS)
        except (TypeError, orjson.JSONEncodeError):  # big ints, non-str keys, deep nesting...
            key = None
        if key is not None and b"null" in key and _has_nan(arguments):
            key = None
        if key is not None and key in self._memo:
            memo = self._memo[key]
            return None if memo is None else list(memo)
        with budget(self.budget_s):
            try:
                result = self._judge(arguments)
            except PatternTimeout as exc:
                self.timeouts += 1
                note = f"{exc}; validity of this call is unknown"
                if self.timeouts >= _MAX_TIMEOUTS:
                    note += f" (out of budget {self.timeouts} times: this schema is not used again in the run)"
                self.notes.append(("timeout", note))
                result = None
            except Exception as exc:  # noqa: BLE001 -- e.g. an unresolvable $ref: the schema is at fault
                self.invalid_reason = f"schema cannot be applied: {_failure(exc)}; validity is unknown"
                self._validator = self._fast = None
                self.notes.append(("invalid", self.invalid_reason))
                return None
        if key is not None:
            if len(self._memo) >= _MEMO_SIZE:
                self._memo.clear()
            self._memo[key] = result
        return None if result is None else list(result)

    def _judge(self, arguments: Any) -> list[str]:
        fast = self._fast
        if fast is not None:
            try:
                if fast(arguments):
                    return []
            except PatternTimeout:
                raise
            except Exception:  # noqa: BLE001 -- anything odd: let jsonschema decide
                pass
        if self._validator.is_valid(arguments):
            return []
        paths = ((_error_path(e.absolute_path), e.message) for e in self._validator.iter_errors(arguments))
        return sorted(f"{path}: {message}" if path else message for path, message in paths)


# Meta-schema verdicts by (dialect, schema) digest, shared by every registry of the process: checking a schema
# against its meta-schema is the costly part of compiling (2.7 s for 10,000 properties), and compare builds a
# registry per scanned chunk. Only the verdict is shared; each registry still builds its own CompiledSchema, whose
# pattern-budget state is per run.
_CHECKED: OrderedDict[bytes, SchemaError | None] = OrderedDict()
_CHECKED_MAX = 1024


_DEDUPED_MAPS = ("properties", "$defs", "definitions")  # maps whose keys the meta-schema does not constrain


def _distinct(schema: Any) -> Any:
    """The schema with each `properties` / `$defs` map holding one name per distinct subschema: what the
    meta-schema says of a map is what it says of each value alone, so the verdict is the same (an error names the
    first property with the bad value), while 10,000 `{"type": "integer"}` properties are checked once, not
    10,000 times (2.9 s). `patternProperties` is kept whole: its names are checked as regular expressions."""
    if isinstance(schema, list):
        return [_distinct(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in _DEDUPED_MAPS and isinstance(value, dict) and len(value) > 1:
            seen: dict[bytes, str] = {}
            for name, sub in value.items():
                try:
                    digest = orjson.dumps(sub, option=orjson.OPT_SORT_KEYS)
                except (TypeError, orjson.JSONEncodeError):
                    digest = name.encode("utf-8", "surrogatepass") + b"\0unique"
                seen.setdefault(digest, name)
            keep = set(seen.values())
            out[key] = {name: _distinct(sub) for name, sub in value.items() if name in keep}
        else:
            out[key] = _distinct(value)
    return out


def _check_schema(cls, schema: Any, text: bytes | None) -> None:
    """`cls.check_schema(schema)`, remembered by the schema's canonical JSON `text` (the registry's key, else
    computed here): raises the same SchemaError for a schema seen before."""
    if text is None:
        try:
            text = orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)
        except (TypeError, orjson.JSONEncodeError):  # deep nesting, non-str keys: not remembered
            cls.check_schema(schema)
            return
    key = hashlib.blake2b(cls.__name__.encode() + b"\0" + text, digest_size=16).digest()
    if key in _CHECKED:
        _CHECKED.move_to_end(key)
        error = _CHECKED[key]
    else:
        try:
            cls.check_schema(_distinct(schema))
            error = None
        except SchemaError as exc:
            error = exc
        _CHECKED[key] = error
        if len(_CHECKED) > _CHECKED_MAX:
            _CHECKED.popitem(last=False)
    if error is not None:
        raise error


def compile_schema(tool_name: str, schema: Any, source: str, text: bytes | None = None) -> CompiledSchema:
    """Normalise, pick the dialect (`$schema`, else Draft 2020-12), check the schema, build the validator.
    `text`: the schema's canonical JSON when the caller has it (it identifies the meta-schema verdict)."""
    try:
        normalised, warnings = normalize_schema(schema) if isinstance(schema, dict) else (schema, [])
    except RecursionError:
        return CompiledSchema(tool_name, schema, source, [], "schema is nested too deeply to be checked")
    compiled = CompiledSchema(tool_name, normalised, source, warnings)
    try:
        cls = (
            validator_for(normalised, default=Draft202012Validator)
            if isinstance(normalised, dict)
            else Draft202012Validator
        )
        _check_schema(cls, normalised, text)
        unsupported = unsupported_reason(normalised)
        if unsupported:
            compiled.invalid_reason = unsupported
            return compiled
        compiled._validator = safe_class(cls)(normalised)  # pattern keywords time-boxed (see schema_keywords)
        if cls in _FAST_DIALECTS:  # draft 4 and older type 1.0 as not an integer: no fast path there
            compiled._fast = compile_fast(normalised)
    except SchemaError as exc:
        where = _error_path(exc.absolute_path)
        compiled.invalid_reason = f"{where}: {exc.message}" if where else exc.message
    except Exception as exc:  # noqa: BLE001 -- e.g. a non-string $schema; report, do not stop the run
        compiled.invalid_reason = f"schema cannot be compiled: {_failure(exc)}"
    return compiled


def _parameters_from_file_doc(doc: dict) -> Any:
    """A schema file holds a bare parameters schema, an OpenAI tool object, or {"name", "parameters"}."""
    fn = doc.get("function")
    if isinstance(fn, dict) and doc.get("type") == "function":
        doc = fn
    if "name" in doc and "properties" not in doc:
        # a tool without parameters takes none: an empty object schema
        return doc.get("parameters", {"type": "object", "properties": {}})
    return doc


class SchemaRegistry:
    """Parameter schemas per tool, each distinct schema compiled once. Override files are read lazily."""

    def __init__(self, schema_dir: Path | str | None = None):
        self.schema_dir = Path(schema_dir) if schema_dir is not None else None
        self._files: dict[str, tuple[Any, str] | None] = {}
        self._compiled: dict[tuple[str, str | bytes], CompiledSchema] = {}

    def _file_schema(self, tool_name: str) -> tuple[Any, str] | None:
        if tool_name in self._files:
            return self._files[tool_name]
        found = None
        # Tool names come from model output: never let one walk out of the schema directory.
        safe = tool_name not in ("", ".", "..") and not any(c in tool_name for c in "/\\\0")
        path = self.schema_dir / f"{tool_name}.json" if self.schema_dir is not None and safe else None
        try:
            exists = path is not None and path.is_file()
        except OSError:  # e.g. a hallucinated 300-character tool name: no such file
            exists = False
        if exists:
            try:
                doc = orjson.loads(path.read_bytes())
            except orjson.JSONDecodeError as exc:
                raise TraceError(
                    str(path), exc.lineno, None, f"schema file is not valid JSON: {exc.msg}"
                ) from exc
            except OSError as exc:
                raise TraceError(str(path), None, None, f"schema file cannot be read: {exc}") from exc
            if not isinstance(doc, (dict, bool)):
                raise TraceError(str(path), None, None, "schema file must hold a JSON object")
            found = (_parameters_from_file_doc(doc) if isinstance(doc, dict) else doc, f"file:{path}")
        self._files[tool_name] = found
        return found

    def get(self, tool_name: str, request_parameters: dict | None = None) -> CompiledSchema | None:
        """The tool's compiled schema: the override file if any, else the request's; None if neither."""
        from_file = self._file_schema(tool_name)
        if from_file is not None:
            schema, source = from_file
            key = (tool_name, source)
        elif request_parameters is not None:
            schema, source = request_parameters, "request"
            try:
                key = (tool_name, orjson.dumps(schema, option=orjson.OPT_SORT_KEYS))
            except (TypeError, orjson.JSONEncodeError):  # deep nesting, non-str keys
                key = (tool_name, deepjson.dumps(schema).encode("utf-8", "surrogatepass"))
        else:
            return None
        compiled = self._compiled.get(key)
        if compiled is None:
            text = key[1] if source == "request" else None
            compiled = self._compiled[key] = compile_schema(tool_name, schema, source, text)
        return compiled


def tool_schemas_from_request(tools: Any) -> tuple[dict[str, dict | None], list[str]]:
    """A request's `tools` -> ({tool name: parameters schema or None}, problems). Never raises.

    Accepts OpenAI Chat tools ({"type": "function", "function": {...}}) and flat ones (Responses API, BFCL).
    Malformed entries are skipped and described in `problems`; the first definition of a name wins.
    """
    schemas: dict[str, dict | None] = {}
    problems: list[str] = []
    if tools is None:
        return schemas, problems
    if not isinstance(tools, list):
        return schemas, [f"tools is not a list (got {type(tools).__name__})"]
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            problems.append(f"tools[{i}] is not an object")
            continue
        fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            problems.append(f"tools[{i}] has no string name")
            continue
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            problems.append(f"tools[{i}] ({name}): parameters is not an object")
            params = None
        if name in schemas:
            problems.append(f"tools[{i}] ({name}): duplicate tool name, first definition kept")
            continue
        schemas[name] = params
    return schemas, problems
