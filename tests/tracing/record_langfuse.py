"""Record the agent sessions with the Langfuse SDK (v5, OpenTelemetry-based) and its OpenAI integration.

    python -m tests.tracing.record_langfuse --base-url URL (--out FILE | --langfuse-host URL)
                                            [--attach propagate|root]

Each session runs inside an agent observation (`start_as_current_observation(as_type="agent")`); the model
calls are the generations `from langfuse.openai import openai` records. `--attach propagate` (the v5 way) wraps
them in `propagate_attributes(session_id=, user_id=, metadata={"customer": ...})`, which puts `session.id`,
`user.id` and `langfuse.trace.metadata.customer` on every span; `--attach root` sets those trace attributes on
the agent span only (what `update_current_trace` did before v5), so the generations must inherit them.

With `--out`, the SDK's span processor exports into memory, and the spans are written to FILE as a collector's
file exporter writes them. With `--langfuse-host`, the SDK's own exporter sends them (OTLP/HTTP protobuf, basic
auth with throwaway keys) to `{host}/api/public/otel/v1/traces`, as to a Langfuse server (`toolaudit collect`
in the live test); `langfuse.shutdown()` flushes it before the script exits.
"""

from __future__ import annotations

import argparse
import json
from contextlib import contextmanager
from pathlib import Path

from tests.tracing.agent import CALLS, Session, run_sessions, write_spans


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--langfuse-host")
    parser.add_argument("--attach", choices=("propagate", "root"), default="propagate")
    args = parser.parse_args()
    if (args.out is None) == (args.langfuse_host is None):
        parser.error("give exactly one of --out and --langfuse-host")

    from langfuse import Langfuse, propagate_attributes
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    langfuse = Langfuse(public_key="pk-lf-local-test", secret_key="sk-lf-local-test",
                        base_url=args.langfuse_host or "http://127.0.0.1:9",
                        span_exporter=None if args.langfuse_host else memory)
    from langfuse.openai import openai

    @contextmanager
    def attach(session: Session):
        with langfuse.start_as_current_observation(name="weather-agent", as_type="agent"):
            if args.attach == "propagate":
                with propagate_attributes(session_id=session.session_id, user_id=session.customer,
                                          metadata={"customer": session.customer}):
                    yield
            else:
                trace.get_current_span().set_attributes({
                    "session.id": session.session_id, "user.id": session.customer,
                    "langfuse.trace.metadata.customer": json.dumps(session.customer)})
                yield

    client = openai.OpenAI(base_url=args.base_url, api_key="unused", max_retries=0)
    done = sum(1 for _ in run_sessions(client, attach))
    assert done == CALLS, done
    langfuse.flush()
    if args.out is not None:
        write_spans(memory.get_finished_spans(), args.out)
    langfuse.shutdown()


if __name__ == "__main__":
    main()
