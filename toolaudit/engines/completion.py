"""What every local engine (torch, hf, vllm) does the same way, so equal tokens give equal rows on each:
per-request seeds, the text cut after a stop string, and the threads a path may use."""

from __future__ import annotations

import hashlib


def row_seed(seed: int, key: str, sample: int = 0) -> int:
    """A per-request seed from (path seed, call key, sample index): a sampled replay of a request does not depend
    on which batch it landed in, a rerun draws the same samples, and sample i of a call is independent of sample
    j (sample 0 keeps the seed replays had before samples existed)."""
    text = f"{seed}:{key}" if sample == 0 else f"{seed}:{key}:{sample}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") & (2**63 - 1)


def cut_after_stop(text: str, start: int, stops: tuple[str, ...]) -> str:
    """Drop what a stop token carried past the stop string (e.g. a newline fused into the same token)."""
    ends = [text.find(s, start) + len(s) for s in stops if text.find(s, start) >= 0]
    return text[: min(ends)] if ends else text


def use_torch_threads(threads: int) -> None:
    """torch's thread count is process-global and paths may differ: engines set it before each load and decode."""
    import torch

    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
