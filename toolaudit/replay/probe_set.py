"""The prompts a probe fingerprint decodes: the bundled probe set (`probe_set.jsonl`, short tool-call prompts
from the demo's traces, near-ties among them: `scripts/make_probe_set.py`) or the user's own (`--probe-file`).

A probe file is JSON Lines, one OpenAI Chat Completions request per line: `{"messages": [...], "tools": [...],
"max_tokens": 16}` (`tools` and `max_tokens` optional; an OpenAI Batch input line, `{"custom_id": ...,
"body": {...}}`, is read through its body). Other request fields (model, temperature, ...) are ignored: a probe
decodes greedily through the path it probes. A line that cannot be used is a `TraceError` naming the file, the
line and the field.

A run's probe (`replay` probes its paths before it decodes, `probes.record_run_probes`) is smaller: `run_probe_set`,
RUN_PROMPTS of the bundled prompts cut to RUN_MAX_TOKENS tokens (source "bundled:run"), so it costs seconds, not
a minute, per path. It is a probe set of its own (its own digest): `probe_set_for` rebuilds it from a stored
probe's source, so `fingerprint --probe --against run:X` and `check --expect-numerics` decode the same prompts.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from toolaudit import TraceError
from toolaudit.engines import EngineRequest

BUNDLED = Path(__file__).with_name("probe_set.jsonl")
DEFAULT_MAX_TOKENS = 16  # generated tokens per probe prompt: enough to pass the tool name and first argument
MAX_PROBE_TOKENS = 256
TOP_K = 5  # log-probabilities kept per step
RUN_SOURCE = "bundled:run"  # the source a run's probe names
# A run's probe: these bundled prompts (0-based lines of probe_set.jsonl; the file is in the demo's order, its
# near-ties spread through it), each a near-tie of the demo's baseline path (`target`, bf16, decoded as a probe
# decodes): a top-1/top-2 logprob margin of exactly 0 within the first RUN_MAX_TOKENS tokens (steps 3, 3, 7, 3,
# 3, 6), where a runtime change flips an argmax first; four customers, six tools. About 6 s on the real model on
# a loaded 2-core CPU, against about a minute for the whole set twice.
RUN_PROMPTS = (2, 3, 15, 21, 27, 28)
RUN_MAX_TOKENS = 8


@dataclass(frozen=True)
class ProbeSet:
    """Probe prompts as engine requests (each asking for the top-`TOP_K` logprobs), where they came from, their
    SHA-256 (`digest`: two probes are comparable only on the same set) and each prompt's token budget."""

    source: str  # "bundled" or the file's path
    requests: tuple[EngineRequest, ...]
    max_tokens: tuple[int, ...]
    digest: str

    def __len__(self) -> int:
        return len(self.requests)

    def select(self, indices: tuple[int, ...], max_tokens: int, source: str) -> ProbeSet:
        """The prompts at `indices`, each cut to `max_tokens` tokens at most: a probe set of its own (`source`, a
        digest of its own prompts, computed as a probe file's would be)."""
        return _probe_set(source, [{"messages": self.requests[i].messages, "tools": self.requests[i].tools,
                                    "max_tokens": min(self.max_tokens[i], max_tokens)} for i in indices])

    def describe(self) -> str:
        """The set in words, for the terminal: "bundled set", "run probe set (...)", or the file."""
        if self.source == "bundled":
            return "bundled set"
        if self.source == RUN_SOURCE:
            return f"a run's probe set: {len(self)} near-ties of the bundled set, {max(self.max_tokens)} tokens each"
        return f"probe file {self.source}"


def load_probe_set(file: str | Path | None = None) -> ProbeSet:
    """The bundled probe set, or the one in `file`."""
    path = Path(file) if file is not None else BUNDLED
    source = "bundled" if file is None else str(file)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise TraceError(source, None, None, "probe file not found") from None
    except OSError as exc:
        raise TraceError(source, None, None, f"cannot read the probe file: {exc}") from None
    prompts: list[dict[str, Any]] = []
    for number, line in enumerate(raw.splitlines(), 1):
        if line.strip():
            prompts.append(parse_probe_line(line, source, number))
    if not prompts:
        raise TraceError(source, None, None, "no probe prompts (one JSON request per line)")
    return _probe_set(source, prompts)


def run_probe_set() -> ProbeSet:
    """What a run probes its paths with: RUN_PROMPTS of the bundled set, RUN_MAX_TOKENS tokens each."""
    return load_probe_set().select(RUN_PROMPTS, RUN_MAX_TOKENS, RUN_SOURCE)


def probe_set_for(source: str) -> ProbeSet:
    """The probe set a stored probe's `source` names: "bundled", a run's ("bundled:run"), or a probe file (a
    `TraceError` when it is gone). Its digest says whether it is still the set that probe decoded."""
    if source == "bundled":
        return load_probe_set()
    if source == RUN_SOURCE:
        return run_probe_set()
    return load_probe_set(source)


def _probe_set(source: str, prompts: list[dict[str, Any]]) -> ProbeSet:
    digest = hashlib.sha256(orjson.dumps(prompts, option=orjson.OPT_SORT_KEYS)).hexdigest()
    requests = tuple(EngineRequest(f"probe-{i}", p["messages"], p["tools"], logprobs=TOP_K)
                     for i, p in enumerate(prompts))
    return ProbeSet(source, requests, tuple(p["max_tokens"] for p in prompts), digest)


def parse_probe_line(line: bytes, source: str, number: int) -> dict[str, Any]:
    """One probe request as {messages, tools, max_tokens}; a `TraceError` for what cannot be used."""
    def fail(field: str | None, message: str) -> TraceError:
        return TraceError(source, number, field, message)

    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise fail(None, f"not valid JSON: {exc}") from None
    if not isinstance(record, dict):
        raise fail(None, f"must be a JSON object (a chat completion request), not {type(record).__name__}")
    prefix = ""
    if "body" in record and "messages" not in record:  # an OpenAI Batch input line
        record, prefix = record["body"], "body."
        if not isinstance(record, dict):
            raise fail("body", "must be a JSON object (a chat completion request)")
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        raise fail(prefix + "messages", "must be a non-empty list of messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise fail(f"{prefix}messages[{i}]", "must be an object with a string 'role'")
    tools = record.get("tools", [])
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise fail(prefix + "tools", "must be a list of tool objects")
    max_tokens = record.get("max_tokens", record.get("max_completion_tokens", DEFAULT_MAX_TOKENS))
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= MAX_PROBE_TOKENS:
        raise fail(prefix + "max_tokens", f"must be an integer from 1 to {MAX_PROBE_TOKENS} (a probe is short), "
                   f"not {max_tokens!r}")
    return {"messages": messages, "tools": tools, "max_tokens": max_tokens}
