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
