"""Decode-path fingerprints: a stable hash of everything that defines a path's numerics.

Stored with every run so that "the model regressed" and "the runtime changed" can be told apart: a new torch,
draft model, dtype or batch size changes the fingerprint, and `check --expect-fingerprint` names which part
(`budgets.changed_components`).
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson


def fingerprint(components: dict[str, Any]) -> str:
    """`fp-` + 16 hex digits of SHA-256 over the canonical JSON of the components."""
    canonical = orjson.dumps(components, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    return "fp-" + hashlib.sha256(canonical).hexdigest()[:16]
