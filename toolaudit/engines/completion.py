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


def cut_after_stop(text: str, start: int, stops: tuple[str, ...], value_end: bool = False) -> str:
    """Drop what a stop token carried past the stop string (e.g. a newline fused into the same token), and with
    `value_end` what follows the JSON value the answer opens with (`ValueEnd`): where its tool call ends."""
    ends = [text.find(s, start) + len(s) for s in stops if text.find(s, start) >= 0]
    closed = value_end_at(text, start) if value_end else None
    if closed is not None:
        ends.append(closed)
    return text[: min(ends)] if ends else text


class ValueEnd:
    """Finds where the JSON value an answer opens with closes, fed the answer's text piece by piece.

    Why: a path whose prefill opens a tool call (`<tool_call>\n`) gets the call's JSON as its answer, and once
    that value closes nothing that follows (the close tag, ~6 tokens of ~45 in the demo) carries an argument.
    Engines that can stop a row stop it there; the text is cut there on every engine, so paths agree on it.
    Only an answer whose first non-blank character opens an object or array counts; anything else never closes
    (it stops at the path's stop strings as before). Braces and brackets inside strings (escapes included) do
    not count.
    """

    __slots__ = ("depth", "in_string", "escaped", "state")

    def __init__(self) -> None:
        self.depth, self.in_string, self.escaped = 0, False, False
        self.state = "start"  # "start" (only blanks so far), "open" (inside the value), "closed", "none"

    def feed(self, piece: str) -> int | None:
        """Scan the next piece; the offset in it just past the value's last character when the value closes
        in this piece, else None (also once it has closed, or when the answer is not a JSON value)."""
        if self.state in ("closed", "none"):
            return None
        for offset, ch in enumerate(piece):
            if self.state == "start":
                if ch.isspace():
                    continue
                if ch not in "{[":
                    self.state = "none"
                    return None
                self.state = "open"
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.state = "closed"
                    return offset + 1
        return None


def value_end_at(text: str, start: int) -> int | None:
    """Where in `text` the JSON value the answer `text[start:]` opens with closes (just past it), else None."""
    closed = ValueEnd().feed(text[start:])
    return None if closed is None else start + closed


def value_closed(text: str, start: int) -> bool:
    """Whether the answer `text[start:]` opens with a JSON value that closes (`ValueEnd`)."""
    return value_end_at(text, start) is not None


def use_torch_threads(threads: int) -> None:
    """torch's thread count is process-global and paths may differ: engines set it before each load and decode."""
    import torch

    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
