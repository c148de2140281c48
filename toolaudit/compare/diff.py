"""Decide whether two parsed outputs drifted, and how, argument by argument.

Canonical JSON comes first (sorted keys, no whitespace): key order and formatting never count as drift, and
the ~99% of pairs that agree never reach DeepDiff. Only differing calls are diffed with DeepDiff.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from deepdiff import DeepDiff

from toolaudit.ingest import deepjson
from toolaudit.store.vocabulary import ArgDiff, ArgDiffKind, CallDiff, DriftKind
from toolaudit.validate.records import ParsedOutput, ToolCall

# Returns True/False for valid/invalid arguments, None when validity is unknown (no or invalid schema).
Validator = Callable[[ToolCall], "bool | None"]

_DEEPDIFF_KINDS = {
    "values_changed": ArgDiffKind.VALUE_CHANGED,
    "type_changes": ArgDiffKind.TYPE_CHANGED,
    "dictionary_item_added": ArgDiffKind.ADDED,
    "dictionary_item_removed": ArgDiffKind.MISSING,
    "iterable_item_added": ArgDiffKind.ADDED,
    "iterable_item_removed": ArgDiffKind.MISSING,
    "attribute_added": ArgDiffKind.ADDED,
    "attribute_removed": ArgDiffKind.MISSING,
    "set_item_added": ArgDiffKind.ADDED,
    "set_item_removed": ArgDiffKind.MISSING,
}


def canonical_json(value: Any) -> bytes:
    """Key order and whitespace independent encoding of a JSON value."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # non-str keys, exotic values, nesting past orjson's 254 levels: still deterministic
        return deepjson.dumps(value).encode()


def call_signature(call: ToolCall) -> tuple[str, bytes]:
    """What must agree for two calls to count as the same call."""
    if call.arguments_error is not None:
        return (call.name, b"!" + (call.raw_arguments or "").encode("utf-8", "replace"))
    return (call.name, canonical_json(call.arguments))


def format_path(parts: list) -> str:
    """['filters', 'status', 0] -> 'filters.status[0]'."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(root)"


def argument_diffs(position: int, tool: str, baseline: Any, candidate: Any) -> list[ArgDiff]:
    """Argument-level differences between two argument objects, addressed by path."""
    try:
        tree = DeepDiff(baseline, candidate, view="tree", verbose_level=2, ignore_order=False)
    except RecursionError:  # nested deeper than DeepDiff can walk: report the differing top-level arguments
        return _shallow_diffs(position, tool, baseline, candidate)
    diffs: list[ArgDiff] = []
    for report_type, items in tree.items():
        kind = _DEEPDIFF_KINDS.get(report_type)
        if kind is None:
            continue
        for item in items:
            path = format_path(item.path(output_format="list"))
            before = None if item.t1 is _NOTPRESENT else item.t1
            after = None if item.t2 is _NOTPRESENT else item.t2
            diffs.append(ArgDiff(position, tool, path, kind, before, after))
    diffs.sort(key=lambda d: d.path)
    return diffs


def _shallow_diffs(position: int, tool: str, baseline: Any, candidate: Any) -> list[ArgDiff]:
    if not isinstance(baseline, dict) or not isinstance(candidate, dict):
        return [ArgDiff(position, tool, "(root)", ArgDiffKind.VALUE_CHANGED, baseline, candidate)]
    diffs = []
    for key in sorted(set(baseline) | set(candidate), key=str):
        if key not in candidate:
            diffs.append(ArgDiff(position, tool, str(key), ArgDiffKind.MISSING, baseline[key], None))
        elif key not in baseline:
            diffs.append(ArgDiff(position, tool, str(key), ArgDiffKind.ADDED, None, candidate[key]))
        elif canonical_json(baseline[key]) != canonical_json(candidate[key]):
            same_type = type(baseline[key]) is type(candidate[key])
            kind = ArgDiffKind.VALUE_CHANGED if same_type else ArgDiffKind.TYPE_CHANGED
            diffs.append(ArgDiff(position, tool, str(key), kind, baseline[key], candidate[key]))
    return diffs


try:  # DeepDiff marks the absent side of added/removed items with a sentinel
    from deepdiff.helper import notpresent as _NOTPRESENT
except ImportError:  # pragma: no cover
    _NOTPRESENT = object()


def pair_calls(baseline: tuple[ToolCall, ...], candidate: tuple[ToolCall, ...]) -> list[tuple[int, int]]:
    """Match parallel calls by position, or by name when the same tools were called in another order."""
    n = min(len(baseline), len(candidate))
    if all(baseline[i].name == candidate[i].name for i in range(n)):
        return [(i, i) for i in range(n)]
    free = list(range(len(candidate)))
    pairs: list[tuple[int, int]] = []
    unmatched: list[int] = []
    for i, call in enumerate(baseline):
        j = next((j for j in free if candidate[j].name == call.name), None)
        if j is None:
            unmatched.append(i)
        else:
            free.remove(j)
            pairs.append((i, j))
    # what is left is paired by position (these are the renamed calls)
    pairs.extend(zip(unmatched, free))
    return sorted(pairs)


def _validity(calls: tuple[ToolCall, ...], validate: Validator) -> bool | None:
    """All calls valid -> True, any invalid -> False, else None (unknown)."""
    result: bool | None = True
    for call in calls:
        ok = validate(call)
        if ok is False:
            return False
        if ok is None:
            result = None
    return result


def diff_outputs(baseline: ParsedOutput, candidate: ParsedOutput, validate_baseline: Validator,
                 validate_candidate: Validator, exact_text_match: bool) -> CallDiff:
    """The drift verdict for one call pair; `exact_text_match` compares the raw outputs, decided by the caller.

    Canonically identical calls are validated once (on the baseline side): the verdict cannot differ.
    """
    b_sig = [call_signature(c) for c in baseline.calls]
    c_sig = [call_signature(c) for c in candidate.calls]
    # Parallel calls are independent: the same calls in another order are not drift.
    same_calls = baseline.status == candidate.status and (b_sig == c_sig or sorted(b_sig) == sorted(c_sig))
    if same_calls:
        valid = _validity(baseline.calls, validate_baseline) if baseline.calls else None
        if baseline.status == "unparseable" and baseline.text != candidate.text:
            return CallDiff(DriftKind.UNPARSEABLE, exact_text_match, None, None, detail="both outputs unparseable")
        kind = DriftKind.IDENTICAL if baseline.text.strip() == candidate.text.strip() else DriftKind.TEXT_ONLY
        return CallDiff(kind, exact_text_match, valid, valid)

    b_valid = _validity(baseline.calls, validate_baseline) if baseline.calls else None
    c_valid = _validity(candidate.calls, validate_candidate) if candidate.calls else None
    broken_args = [c for c in candidate.calls if c.arguments_error] + [c for c in baseline.calls
                                                                        if c.arguments_error]
    if baseline.status == "unparseable" or candidate.status == "unparseable" or broken_args:
        side = "candidate" if candidate.status == "unparseable" or any(
            c.arguments_error for c in candidate.calls) else "baseline"
        reason = candidate.error if side == "candidate" else baseline.error
        if broken_args and not reason:
            reason = broken_args[0].arguments_error
        return CallDiff(DriftKind.UNPARSEABLE, exact_text_match, b_valid, c_valid,
                        detail=f"{side} output unparseable: {reason}")

    pairs = pair_calls(baseline.calls, candidate.calls)
    arg_diffs: list[ArgDiff] = []
    renamed = []
    for i, j in pairs:
        b, c = baseline.calls[i], candidate.calls[j]
        if b.name != c.name:
            renamed.append(f"{b.name} -> {c.name}")
            continue
        if b_sig[i] != c_sig[j]:
            arg_diffs.extend(argument_diffs(i, b.name, b.arguments, c.arguments))

    if len(baseline.calls) != len(candidate.calls):
        kind, detail = DriftKind.CALL_COUNT_CHANGED, f"{len(baseline.calls)} -> {len(candidate.calls)} tool calls"
    elif renamed:
        kind, detail = DriftKind.TOOL_NAME_CHANGED, "; ".join(renamed)
    elif b_valid is True and c_valid is False:
        kind, detail = DriftKind.SCHEMA_BROKEN, "valid on baseline, invalid on candidate"
    else:
        kind, detail = DriftKind.ARGUMENTS_CHANGED, f"{len(arg_diffs)} argument(s) differ"
    return CallDiff(kind, exact_text_match, b_valid, c_valid, arg_diffs, detail)
