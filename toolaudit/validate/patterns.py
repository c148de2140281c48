"""Regular expressions from untrusted schemas, matched with a time budget.

Tool schemas come from recorded requests, and the strings they constrain come from model output: a schema
`"pattern": "(a+)+$"` and an answer of forty `a`s and a `!` keep Python's backtracking `re` busy for days, and
`re` cannot be interrupted (no signal reaches its C loop). Every pattern of a schema is therefore matched here,
with the `regex` module, whose matcher takes a timeout and gives up cleanly; its syntax and semantics are those
of `re` (what jsonschema uses), so verdicts do not change for ordinary patterns.

One validation of one call's arguments runs inside `budget(seconds)`: all the pattern matches it makes share
that time. When it runs out, `PatternTimeout` is raised, naming the pattern; the caller then treats the call's
validity as unknown and records a schema issue.
"""

from __future__ import annotations

import contextvars
import functools
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import regex

MAX_LITERAL_RUN = 500  # longest run of plain characters a pattern may hold (see `untimed_reason`)
DEFAULT_BUDGET_S = 0.5  # time one call's validation may spend in pattern matching
_FALLBACK_S = 0.5  # a match outside any budget (e.g. a direct call) gets this much


class PatternTimeout(Exception):
    """Matching `pattern` did not finish within the validation budget."""

    def __init__(self, pattern: str, seconds: float):
        self.pattern, self.seconds = pattern, seconds
        super().__init__(f"pattern {shorten(pattern)!r} did not finish within the {seconds:g} s validation budget")


class PatternError(ValueError):
    """A pattern that does not compile."""


_deadline: contextvars.ContextVar[tuple[float, float] | None] = contextvars.ContextVar("pattern_deadline",
                                                                                       default=None)


def shorten(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


@contextmanager
def budget(seconds: float = DEFAULT_BUDGET_S) -> Iterator[None]:
    """All pattern matches inside share `seconds` of matching time (nested budgets keep the outer deadline)."""
    if _deadline.get() is not None:
        yield
        return
    token = _deadline.set((time.monotonic() + seconds, seconds))
    try:
        yield
    finally:
        _deadline.reset(token)


def untimed_reason(pattern: str) -> str | None:
    """Why matching `pattern` cannot be time-boxed, or None.

    The `regex` module builds a search table for a literal run on its first match, outside the timeout's reach,
    in time that grows with the cube of the run for repetitive text: 1,000 `a`s take 0.5 s, 2,000 take 5 s,
    100,000 never end. Real patterns hold short literals (alternations of words), so a longer run is refused
    before any match is tried."""
    run = longest = 0
    escaped = False
    for char in pattern:
        if escaped:
            escaped = False
            run = run + 1 if not char.isalnum() else 0  # `\.` is a literal, `\d` a class
        elif char == "\\":
            escaped = True
            continue
        elif char in _META:
            run = 0
        else:
            run += 1
        longest = max(longest, run)
    if longest > MAX_LITERAL_RUN:
        return (f"pattern {shorten(pattern)!r} holds a literal run of {longest} characters (over "
                f"{MAX_LITERAL_RUN}): its first match cannot be time-boxed, so it is not matched")
    return None


_META = frozenset(".^$*+?{}[]()|")


def compile_pattern(pattern: str) -> Any:
    """The compiled pattern; PatternError when it is not a valid regular expression."""
    if not isinstance(pattern, str):
        raise PatternError(f"pattern must be a string, got {type(pattern).__name__}")
    return _compile(pattern)


@functools.lru_cache(maxsize=1024)
def _compile(pattern: str) -> Any:
    try:
        return regex.compile(pattern, regex.VERSION0)
    except (regex.error, ValueError, OverflowError, RecursionError) as exc:
        raise PatternError(f"invalid pattern {shorten(pattern)!r}: {exc}") from None


def search(pattern: str, text: str) -> bool:
    """`re.search(pattern, text) is not None`, within the current budget. Raises PatternTimeout, PatternError."""
    compiled = compile_pattern(pattern)
    window = _deadline.get()
    if window is None:
        remaining, total = _FALLBACK_S, _FALLBACK_S
    else:
        remaining, total = window[0] - time.monotonic(), window[1]
        if remaining <= 0:
            raise PatternTimeout(pattern, total)
    try:
        return compiled.search(text, timeout=remaining) is not None
    except TimeoutError:
        raise PatternTimeout(pattern, total) from None
