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


def sampling(run: dict) -> dict[str, Any] | None:
    """How a run's answers were drawn, when at temperature > 0: `temperature` (the highest of its paths', or of
    the recorded requests' for a comparison of logs), `samples_per_call`, and `sampling_noise`: True when each
    call has one sample per side, so a per-call difference measures sampling noise, not drift (docs/statistics.md).
    None for greedy runs and runs that do not say."""
    options = run_options(run)
    configs = [options.get(k) for k in ("baseline_config", "candidate_config")]
    temps = [c.get("temperature") or 0.0 for c in configs if isinstance(c, dict)]
    recorded = options.get("request_temperature")  # compare: the highest temperature the recorded requests asked
    if isinstance(recorded, (int, float)):
        temps.append(float(recorded))
    temperature = max(temps, default=0.0)
    if temperature <= 0:
        return None
    per_call = samples_per_call(run)
    return {"temperature": temperature, "samples_per_call": per_call, "sampling_noise": per_call == 1}


def samples_per_call(run: dict) -> int:
    """The run's samples per call and path (`options.samples` of a sampled replay), 1 when it has none."""
    try:
        return max(1, int(run_options(run).get("samples") or 1))
    except (TypeError, ValueError):
        return 1


def is_sampled(run: dict) -> bool:
    """A sampled run: a replay that decoded each call at least twice per path (`analysis/sampled.py`)."""
    return samples_per_call(run) >= 2
