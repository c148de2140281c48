"""What a stored run row says of itself, read where several analyses need it (figures, gates, the noise floor)."""

from __future__ import annotations

from typing import Any

import orjson


def run_options(run: dict) -> dict[str, Any]:
    """The options a run was started with (its JSON column), `{}` when absent or unreadable."""
    try:
        options = orjson.loads(run["options"]) if run.get("options") else {}
    except orjson.JSONDecodeError:
        return {}
    return options if isinstance(options, dict) else {}


def samples_per_call(run: dict) -> int:
    """The run's samples per call and path (`options.samples` of a sampled replay), 1 when it has none."""
    try:
        return max(1, int(run_options(run).get("samples") or 1))
    except (TypeError, ValueError):
        return 1


def is_sampled(run: dict) -> bool:
    """A sampled run: a replay that decoded each call at least twice per path (`analysis/sampled.py`)."""
    return samples_per_call(run) >= 2
