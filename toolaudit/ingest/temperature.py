"""The sampling temperature recorded traffic asked for: at temperature > 0 two logs of the same requests differ
call by call through sampling alone, so `compare` says so instead of calling the differences drift."""

from __future__ import annotations

from pathlib import Path

from toolaudit import ToolauditError
from toolaudit.ingest.reading import read_trace
from toolaudit.ingest.records import TraceCall

SCANNED = 500  # records read from the start of a log: enough to see how its traffic samples


def recorded_temperature(path: str | Path, session_key: str, customer_key: str, fmt: str | None = None,
                         limit: int = SCANNED) -> float | None:
    """The highest `temperature` among the first `limit` requests of a log (None when none says; a request
    without one is taken as greedy). A file that cannot be read gives None: reading it is `compare`'s job."""
    highest: float | None = None
    try:
        for n, item in enumerate(read_trace(path, session_key, customer_key, require_response=False, fmt=fmt)):
            if n >= limit:
                break
            if isinstance(item, TraceCall):
                t = item.request.get("temperature")
                if isinstance(t, (int, float)) and not isinstance(t, bool):
                    highest = max(highest or 0.0, float(t))
    except (ToolauditError, OSError):
        return None
    return highest
