"""What every local engine (torch, hf, vllm) does the same way, so equal tokens give equal rows on each:
per-request seeds, the text cut after a stop string, and the threads a path may use."""

from __future__ import annotations

import hashlib
import os


def row_seed(seed: int, key: str) -> int:
    """A per-request seed: a sampled replay of a request does not depend on which batch it landed in."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{key}".encode()).digest()[:8], "big") & (2**63 - 1)


def cut_after_stop(text: str, start: int, stops: tuple[str, ...]) -> str:
    """Drop what a stop token carried past the stop string (e.g. a newline fused into the same token)."""
    ends = [text.find(s, start) + len(s) for s in stops if text.find(s, start) >= 0]
    return text[: min(ends)] if ends else text


def available_cores() -> int:
    """The cores this process may run on (its affinity mask: a container or taskset may allow fewer than exist)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def use_torch_threads(threads: int) -> None:
    """torch's thread count is process-global and paths may differ: engines set it before each load and decode."""
    import torch

    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
