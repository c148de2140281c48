"""The prompts a probe fingerprint decodes: the bundled probe set (`probe_set.jsonl`, short tool-call prompts
from the demo's traces, near-ties among them: `scripts/make_probe_set.py`) or the user's own (`--probe-file`).

A probe file is JSON Lines, one OpenAI Chat Completions request per line: `{"messages": [...], "tools": [...],
"max_tokens": 16}` (`tools` and `max_tokens` optional; an OpenAI Batch input line, `{"custom_id": ...,
"body": {...}}`, is read through its body). Other request fields (model, temperature, ...) are ignored: a probe
decodes greedily through the path it probes. A line that cannot be used is a `TraceError` naming the file, the
line and the field.
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
