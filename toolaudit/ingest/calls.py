"""A reader's `Call` checked into a record: a `RawCall`, or a `TraceLineError` naming the user's file, line, span and
field, exactly as a line of an OpenAI log holding that call would be checked (`openai_lines.parse_line`).

The request gains its session, customer and call index in `request.metadata` (as `toolaudit import` writes it),
so a call is the same whatever format it was read from; an error row's excerpt is the start of that log line.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson

from toolaudit.ingest import deepjson
from toolaudit.ingest.formats.base import Call, as_key
from toolaudit.ingest.formats.openai_lines import NO_RESPONSE, as_index, check_request
from toolaudit.ingest.records import (
    CALL_INDEX_KEY,
    DEFAULT_SESSION_KEY,
    RawCall,
    TraceLineError,
    line_error,
)

NO_ANSWER = "missing: the record holds no answer to compare (was message content capture switched on?)"


def chat_request(call: Call) -> dict:
    """The call's request with its session, customer and call index in `metadata` (what an OpenAI log holds)."""
    request = dict(call.request)
    metadata = dict(request["metadata"]) if isinstance(request.get("metadata"), dict) else {}
    metadata["session_id"] = call.session_id
    if call.customer is not None:
        metadata["customer"] = call.customer
    if call.call_index is not None:
        metadata["call_index"] = call.call_index
    request["metadata"] = metadata
    return request


def log_line(request: dict, response: dict | None) -> bytes:
    """The call as one OpenAI-log line (for an error row's excerpt)."""
    record = {"request": request, "response": response}
    try:
        return orjson.dumps(record)
    except TypeError:  # nested past orjson's 254 levels
        return deepjson.dumps(record, sort_keys=False).encode()


def named(word: str, record: str | None, message: str) -> str:
    """"span 5f2c: message" for a record with an id, else the message."""
    return f"{word} {record}: {message}" if record else message


def check_call(call: Call, source: str, word: str, require_response: bool, key: int) -> RawCall | TraceLineError:
    """The call as a record found again by `key`, or the error row a log line holding it would give.
    `word` names a record in messages ("span", "observation")."""
    request, response, origin = chat_request(call), call.response, call.origin

    def error(field: str | None, message: str) -> TraceLineError:
        err = line_error(log_line(request, response), source, origin.line, field, message)
        return TraceLineError(err.source, err.line, err.field, named(word, origin.record, err.message), err.excerpt)

    problem = check_request(request)
    if problem:
        return error(*problem)
    if response is not None and not isinstance(response, dict):
        return error("response", f"must be an object, got {type(response).__name__}")
    if require_response and response is None:
        return error(origin.response_field, NO_ANSWER) if origin.response_field else error("response", NO_RESPONSE)
    metadata: dict[str, Any] = request["metadata"]
    session_id = as_key(metadata.get("session_id"))
    if session_id is None:
        return error(DEFAULT_SESSION_KEY, "missing or not a string: cannot tell which session this call belongs "
                                          "to (use --session-key to name another field)")
    explicit = metadata.get("call_index")
    index = None
    if explicit is not None:
        index = as_index(explicit)
        if index is None:
            return error(CALL_INDEX_KEY, f"must be an integer from 0 to 2147483647, got {explicit!r}")
    return RawCall(origin.line, session_id, index, as_key(metadata.get("customer")), request, response, key,
                   origin.record)


def error_about(call: RawCall, source: str, word: str, line: int, field: str | None, message: str) -> TraceLineError:
    """An error row about a checked call (a duplicate call index), its excerpt the call's log line."""
    err = line_error(log_line(call.request, call.response), source, line, field, message)
    return TraceLineError(err.source, err.line, err.field, named(word, call.record, err.message), err.excerpt)


def indexed(call: RawCall, index: int) -> RawCall:
    """A checked call given its call index (a span format's, known once the whole file is read), in its request's
    metadata too, as a log line holding it would carry it."""
    metadata = {**call.request["metadata"], "call_index": str(index)}
    return replace(call, explicit_index=index, request={**call.request, "metadata": metadata})


def rekeyed(call: RawCall, session_id: str, customer: str | None) -> RawCall:
    """A checked call given the session and customer its source settled on (a span's, inherited from its parent
    spans or its trace), in its request's metadata too."""
    metadata = {**call.request["metadata"], "session_id": session_id}
    if customer is not None:
        metadata["customer"] = customer
    return replace(call, session_id=session_id, customer=customer, inherits=False,
                   request={**call.request, "metadata": metadata})
