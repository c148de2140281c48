"""Shards: split one comparison or replay over N processes or nodes by whole sessions, then merge them exactly.

`--shard K/N` (K is 1-based: 1/3, 2/3, 3/3) keeps the sessions whose stable hash falls in shard K:

    shard_of(session_id, N) = int(sha1(session_id as UTF-8)[:8 bytes], big-endian) % N + 1

Whole sessions, so session statistics (observed and compounded session drift) stay exact. Rows that belong to
no session (input error rows of lines whose session cannot be read) are stored by shard 1 only, so the shards'
rows add up to the unsharded run's with nothing counted twice. `merge_counts` folds the shards' `counts` JSON
into what one unsharded run would have recorded.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from toolaudit import ConfigError, StoreError


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @property
    def owns_unkeyed(self) -> bool:
        """Whether rows that belong to no session (bad input lines) are this shard's to store."""
        return self.index == 1

    def holds(self, session_id: str) -> bool:
        return self.count == 1 or shard_of(session_id, self.count) == self.index

    def as_dict(self) -> dict[str, int]:
        return {"index": self.index, "count": self.count}


def shard_of(session_id: str, count: int) -> int:
    """The 1-based shard of a session among `count` shards (stable across processes, machines, Python runs)."""
    digest = hashlib.sha1(session_id.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % count + 1


def parse_shard(text: str | None) -> Shard | None:
    """`K/N` with 1 <= K <= N (None passes through)."""
    if text is None:
        return None
    parts = text.strip().split("/")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise ConfigError(f"--shard must be K/N with 1 <= K <= N, e.g. 1/4 (got {text!r})")
    index, count = int(parts[0]), int(parts[1])
    if count < 1 or not 1 <= index <= count:
        raise ConfigError(f"--shard {text}: K must be between 1 and N (shards are numbered 1..{max(count, 1)})")
    return Shard(index, count)


def shard_from_options(options: dict[str, Any]) -> Shard | None:
    raw = options.get("shard")
    if isinstance(raw, dict) and isinstance(raw.get("index"), int) and isinstance(raw.get("count"), int):
        return Shard(raw["index"], raw["count"])
    return None


# -- merging the counts JSON ------------------------------------------------------------------------------------

# Per-side keys that describe the whole input file: every shard reads all of it, so they must agree.
_WHOLE_FILE = ("lines", "blank", "records", "skipped")


def _add(into: dict, value: dict) -> None:
    for key, v in value.items():
        if isinstance(v, dict):
            _add(into.setdefault(key, {}), v)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            into[key] = into.get(key, 0) + v
        else:
            into.setdefault(key, v)


def _same(what: str, values: list[Any]) -> Any:
    if any(v != values[0] for v in values[1:]):
        raise StoreError(f"cannot merge: the shards read different inputs ({what} differ: "
                         f"{', '.join(map(repr, values))})")
    return values[0]


def merge_counts(kind: str, counts: list[dict], mismatches_shown: int = 5) -> dict:
    """The `counts` of one unsharded run from its shards' (what each read of the whole input must agree);
    `mismatches_shown`: how many mismatched pairs a compare run's counts name (`compare.join`)."""
    merged: dict[str, Any] = {}
    if kind == "compare":
        for side in ("baseline", "candidate"):
            stats = [c.get(side) or {} for c in counts]
            out = {k: _same(f"{side} {k}", [s.get(k) for s in stats]) for k in _WHOLE_FILE}
            for key in ("calls", "errors"):
                out[key] = sum(s.get(key, 0) for s in stats)
            merged[side] = out
        for key in ("matched", "baseline_only", "candidate_only", "truncated", "mismatched", "drifted"):
            merged[key] = sum(c.get(key, 0) for c in counts)
        kinds: dict[str, int] = {}
        for c in counts:
            for k, n in (c.get("kinds") or {}).items():
                kinds[k] = kinds.get(k, 0) + n
        merged["kinds"] = kinds
        # each shard's first mismatched pairs by baseline line: together they hold the whole run's first ones
        mismatches = sorted((m for c in counts for m in c.get("mismatches") or []),
                            key=lambda m: (m.get("baseline_line") or 0, m.get("candidate_line") or 0))
        merged["mismatches"] = mismatches[:mismatches_shown]
        merged["pairing"] = _same("pairing", [c.get("pairing") or {} for c in counts])
        merged["formats"] = _same("formats", [c.get("formats") for c in counts])
        merged["skipped_reasons"] = _same("skipped reasons", [c.get("skipped_reasons") for c in counts])
    else:  # replay: the trace statistics describe the whole files; the rest of the replay block is per shard
        for key in ("baseline", "candidate"):
            merged[key] = _same(key, [c.get(key) for c in counts])
        blocks = [dict(c.get("replay") or {}) for c in counts]
        replay: dict[str, Any] = {"traces": _same("trace files", [b.pop("traces", None) for b in blocks])}
        for block in blocks:
            _add(replay, block)
        merged["replay"] = replay
    return merged
