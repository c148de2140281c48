"""Record the agent sessions with Arize's OpenInference OpenAI instrumentation, as a user would.

    python -m tests.tracing.record_oi --base-url URL [--out FILE] [--customer-via user|metadata|both]
                                      [--otlp-endpoint BASE]

The session is attached with `using_session`, the customer with `using_user` (the `user.id` attribute) and/or
`using_metadata({"customer": ...})` (a JSON-string `metadata` attribute).
The finished spans are written to FILE as a collector's file exporter writes them (OTLP/JSON, hex ids) and/or,
with `--otlp-endpoint BASE`, sent to BASE/v1/traces by the real OTLP/HTTP exporter behind a batch processor
(`toolaudit collect`, or any collector), as `record.py` does. Run in a subprocess: the instrumentation patches
`openai` for the interpreter.
"""

from __future__ import annotations

import argparse
from contextlib import ExitStack, contextmanager
from pathlib import Path

from tests.tracing.agent import CALLS, Session, run_sessions, write_spans


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--customer-via", choices=("user", "metadata", "both"), default="user")
    parser.add_argument("--otlp-endpoint", help="export over OTLP/HTTP protobuf to this base URL's /v1/traces")
    args = parser.parse_args()
    if args.out is None and args.otlp_endpoint is None:
        parser.error("give --out, --otlp-endpoint or both")

    import openai
    from openinference.instrumentation import using_metadata, using_session, using_user
    from openinference.instrumentation.openai import OpenAIInstrumentor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    if args.otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        endpoint = args.otlp_endpoint.rstrip("/") + "/v1/traces"
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    OpenAIInstrumentor().instrument(tracer_provider=provider)

    @contextmanager
    def attach(session: Session):
        with ExitStack() as stack:
            stack.enter_context(using_session(session.session_id))
            if args.customer_via in ("user", "both"):
                stack.enter_context(using_user(session.customer))
            if args.customer_via in ("metadata", "both"):
                stack.enter_context(using_metadata({"customer": session.customer, "plan": "pro"}))
            yield

    client = openai.OpenAI(base_url=args.base_url, api_key="unused", max_retries=0)
    done = sum(1 for _ in run_sessions(client, attach))
    provider.force_flush()
    assert done == CALLS, done
    provider.shutdown()
    if args.out is not None:
        write_spans(memory.get_finished_spans(), args.out)


if __name__ == "__main__":
    main()
