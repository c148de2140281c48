"""Langfuse SDK spans (the OpenTelemetry-based Python SDK v3 to v5, and its OpenAI integration), from an OTLP/JSON
export: the spans the SDK sends to a Langfuse server's `/api/public/otel/v1/traces`, as a collector writes them.

A call is a span whose `langfuse.observation.type` is `generation`; other observations (span, agent, tool,
event...) are skipped with their type. The generation's content is in attributes that hold JSON written by the
SDK: `langfuse.observation.input` (Chat messages, or `{"messages", "tools"}` from the OpenAI integration, or a
plain string), `langfuse.observation.output` (an assistant message, a ChatCompletion or a string),
`langfuse.observation.model.name`, `langfuse.observation.model.parameters` and
`langfuse.observation.usage_details`. They are read as the Langfuse server export's fields are (`langfuse`).
Spans of other instrumentations that the SDK's span processor exported alongside (an OpenInference LLM span, an
OTel GenAI chat span) are read by their own convention, as a Langfuse server ingests them.

The session is `session.id`, the customer `user.id` (trace attributes that `propagate_attributes` puts on every
span; a generation without them takes them from its parent spans, else its trace: `otlp_export.Context`). The SDK
writes trace and observation metadata as `langfuse.trace.metadata.<key>` / `langfuse.observation.metadata.<key>`,
each value JSON-encoded; they are decoded and also offered as `metadata.<key>` (trace metadata first), so
`--customer-key metadata.customer` finds `propagate_attributes(metadata={"customer": ...})`.
"""

from __future__ import annotations

from typing import Any

import orjson

from toolaudit.ingest.formats import langfuse_fields, openinference, otel
from toolaudit.ingest.formats.base import Call, Invalid, Keys, Origin, chat_response, usage_block
from toolaudit.ingest.formats.otlp import Span
from toolaudit.ingest.formats.span_family import Context

TYPE = "langfuse.observation.type"
PREFIX = "langfuse.observation."
SESSION_ATTRS = ("session.id",)
CUSTOMER_ATTRS = ("user.id",)
CONTEXT = Context(SESSION_ATTRS, CUSTOMER_ATTRS)
_METADATA = ("langfuse.trace.metadata", "langfuse.observation.metadata")  # trace metadata wins in `metadata.*`


def span_to_call(span: Span, keys: Keys) -> Call | str:
    _offer_metadata(span)
    kind = span.attr(TYPE)
    if kind is None:  # another instrumentation's span sent through Langfuse's span processor
        if span.attr(openinference.KIND) is not None:
            return openinference.span_to_call(span, keys)
        if span.attr("gen_ai.operation.name") is not None:
            return otel.span_to_call(span, keys)
        return f"no {TYPE}"
    if str(kind).lower() != "generation":
        return f"{TYPE} {kind!r}"
    span.check_times()
    session = span.session(keys, SESSION_ATTRS) or span.trace_id
    customer = span.customer(keys, CUSTOMER_ATTRS)
    observation: dict[str, Any] = {"model": span.attr(PREFIX + "model.name"),
                                   "input": _content(span.attr(PREFIX + "input"))}
    params = span.attr(PREFIX + "model.parameters")
    if params is not None:
        observation["modelParameters"] = _json(params, PREFIX + "model.parameters")
    try:
        request = langfuse_fields.request(observation)
        output = _content(span.attr(PREFIX + "output"))
        answer = None if output is None else langfuse_fields.answer(output)
    except Invalid as exc:  # name the attribute: "langfuse.observation.input.messages[2].role"
        raise Invalid(PREFIX + exc.field if exc.field else None, exc.message) from None
    response = None
    if answer is not None:
        usage = _json(span.attr(PREFIX + "usage_details"), PREFIX + "usage_details")
        usage = usage if isinstance(usage, dict) else {}
        response = chat_response(answer, langfuse_fields.finish_reason(output), model=observation["model"],
                                 created=span.start // 1_000_000_000 if span.start else None,
                                 usage=usage_block(usage.get("prompt_tokens", usage.get("input")),
                                                   usage.get("completion_tokens", usage.get("output"))))
    return Call(session, customer, request, response, Origin(span.line, span.span_id, PREFIX + "output"),
                order=span.order())


def _json(value: Any, field: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise Invalid(field, f"not valid JSON: {exc}") from None


def _content(value: Any) -> Any:
    """Input or output as the SDK wrote it: JSON of structure, but a string it was given as is (not JSON)."""
    if not isinstance(value, str):
        return value
    try:
        parsed = orjson.loads(value)
    except orjson.JSONDecodeError:
        return value
    return parsed if isinstance(parsed, (dict, list, str)) else value


def _offer_metadata(span: Span) -> None:
    """Decode the SDK's JSON-encoded metadata values in place and offer them as `metadata.<key>` too."""
    for prefix in _METADATA:
        start = prefix + "."
        for key in [k for k in span.attributes if k.startswith(start)]:
            value = span.attributes[key]
            if isinstance(value, str):
                try:
                    value = orjson.loads(value)
                except orjson.JSONDecodeError:
                    pass  # written by something other than the v5 SDK: kept as it is
                span.attributes[key] = value
            span.attributes.setdefault("metadata." + key[len(start):], value)
        whole = span.attributes.get(prefix)  # metadata that was not an object: one JSON value
        if isinstance(whole, str) and "metadata" not in span.attributes:
            try:
                span.attributes["metadata"] = orjson.loads(whole)
            except orjson.JSONDecodeError:
                pass
