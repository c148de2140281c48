"""Each instrumentation library set up as its users set it up: the real instrumentor on the global `openai`
module, the SDK's providers, and the session and customer attached the way teams attach them with that library.

`setup(library, mode)` returns the `Attach` for `agent.run_sessions` and the providers to flush. Modes:

- `otel-v2` (OpenTelemetry's `opentelemetry-instrumentation-openai-v2` with `opentelemetry-util-genai`):
  `span` (latest conventions, content in span attributes `gen_ai.input.messages`...), `event` (latest
  conventions, content in `gen_ai.client.inference.operation.details` log records), `none` (content capture
  off). (2.4b0 on the v1.30 conventions emits no content at all, even with capture `true`.) The customer is
  `user.id` in baggage, copied onto every span by a span processor (what `opentelemetry-processor-baggage` does);
  the session `gen_ai.conversation.id` on a parent agent span only (which ends after the model calls), or, in
  `event` mode, `session.id` in baggage (no agent span: each call is its own trace).
- `openllmetry` (Traceloop's `opentelemetry-instrumentation-openai`): `span` (content in span attributes). The
  session and customer are association properties, as `traceloop-sdk`'s `Traceloop.set_association_properties`
  sets them: a context value that the SDK's span processor copies onto every span as
  `traceloop.association.properties.<key>`. traceloop-sdk is not installed here: the context value and that
  processor are set up directly (`_Association`).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, field

from opentelemetry import baggage, context, trace
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.tracing.agent import Attach, Session

MODES = {"otel-v2": ("span", "event", "none"), "openllmetry": ("span",)}
_V2_CAPTURE = {"span": "span_only", "event": "event_only"}
ASSOCIATION_KEY = "association_properties"  # traceloop-sdk's context key (traceloop.sdk.tracing.tracing)


class _Baggage(SpanProcessor):
    """Copies `user.id` / `session.id` baggage onto every span that starts (opentelemetry-processor-baggage)."""

    def on_start(self, span, parent_context=None) -> None:
        for key, value in baggage.get_all(parent_context).items():
            span.set_attribute(key, str(value))


class _Association(SpanProcessor):
    """What traceloop-sdk's span processor does with association properties: every span gets them as
    `traceloop.association.properties.<key>`."""

    def on_start(self, span, parent_context=None) -> None:
        for key, value in (context.get_value(ASSOCIATION_KEY, parent_context) or {}).items():
            span.set_attribute(f"traceloop.association.properties.{key}", value)


@dataclass
class Recording:
    attach: Attach
    spans: InMemorySpanExporter = field(default_factory=InMemorySpanExporter)
    logs: InMemoryLogExporter = field(default_factory=InMemoryLogExporter)
    providers: list = field(default_factory=list)

    def flush(self) -> None:
        for provider in self.providers:
            provider.force_flush()

    def shutdown(self) -> None:
        """Flush and stop the providers: the batch processors send what they still hold before the process exits."""
        for provider in self.providers:
            provider.shutdown()


def setup(library: str, mode: str, otlp_endpoint: str | None = None) -> Recording:
    """The library instrumenting `openai`, spans and logs kept in memory (and sent to `otlp_endpoint`'s
    /v1/traces and /v1/logs by the real OTLP/HTTP exporters, batched as services batch them, when given)."""
    if mode not in MODES.get(library, ()):
        raise SystemExit(f"unknown library/mode {library}/{mode} (known: {MODES})")
    if library == "otel-v2" and mode in _V2_CAPTURE:
        os.environ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = _V2_CAPTURE[mode]
        os.environ["OTEL_SEMCONV_STABILITY_OPT_IN"] = "gen_ai_latest_experimental"
    resource = Resource.create({"service.name": f"weather-agent-{library}"})
    tracer_provider = TracerProvider(resource=resource)
    logger_provider = LoggerProvider(resource=resource)
    attach = (_attach_openllmetry if library == "openllmetry" else
              _attach_v2_baggage if mode == "event" else _attach_v2_agent)
    recording = Recording(attach, providers=[tracer_provider, logger_provider])
    tracer_provider.add_span_processor(_Baggage() if library == "otel-v2" else _Association())
    tracer_provider.add_span_processor(SimpleSpanProcessor(recording.spans))
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(recording.logs))
    if otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        base = otlp_endpoint.rstrip("/")
        tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{base}/v1/traces")))
        logger_provider.add_log_record_processor(BatchLogRecordProcessor(OTLPLogExporter(endpoint=f"{base}/v1/logs")))
    trace.set_tracer_provider(tracer_provider)
    if library == "otel-v2":
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

        OpenAIInstrumentor().instrument(tracer_provider=tracer_provider, logger_provider=logger_provider)
    else:
        from opentelemetry.instrumentation.openai import OpenAIInstrumentor

        os.environ["TRACELOOP_TRACE_CONTENT"] = "true"
        OpenAIInstrumentor().instrument(tracer_provider=tracer_provider)
    return recording


@contextmanager
def _attach_v2_agent(session: Session):
    """`user.id` in baggage; `gen_ai.conversation.id` only on the agent span around the session's calls."""
    token = context.attach(baggage.set_baggage("user.id", session.customer))
    try:
        tracer = trace.get_tracer("weather-agent")
        with tracer.start_as_current_span("invoke_agent weather", attributes={
                "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "weather",
                "gen_ai.conversation.id": session.session_id}):
            yield
    finally:
        context.detach(token)


@contextmanager
def _attach_v2_baggage(session: Session):
    """`session.id` and `user.id` in baggage only: every call is a root span of its own trace."""
    token = context.attach(baggage.set_baggage("user.id", session.customer,
                                               baggage.set_baggage("session.id", session.session_id)))
    try:
        yield
    finally:
        context.detach(token)


@contextmanager
def _attach_openllmetry(session: Session):
    """`Traceloop.set_association_properties({...})` without traceloop-sdk: the same context value."""
    token = context.attach(context.set_value(ASSOCIATION_KEY, {"session_id": session.session_id,
                                                                "customer_id": session.customer}))
    try:
        yield
    finally:
        context.detach(token)
