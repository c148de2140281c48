"""The Langfuse SDK pointed at `toolaudit collect` (`base_url`): it exports OTLP/HTTP to Langfuse's path
(`/api/public/otel/v1/traces`), and the receiver keeps its observation spans (`langfuse.` attributes) with the
session and user it propagates, never its keys (the SDK sends them as Basic auth)."""

from __future__ import annotations

import base64
import json

from .support import stored_spans


def test_the_langfuse_sdk_exports_to_the_receiver(receiver):
    from langfuse import Langfuse, propagate_attributes

    client = Langfuse(public_key="pk-lf-test", secret_key="sk-lf-do-not-store", base_url=receiver.url,
                      tracing_enabled=True)
    with client.start_as_current_observation(as_type="span", name="agent"):
        with propagate_attributes(session_id="sess-1", user_id="acme"):
            with client.start_as_current_observation(as_type="generation", name="chat", model="m",
                                                     input=[{"role": "user", "content": "hi"}]) as generation:
                generation.update(output={"role": "assistant", "content": "hello"})
    client.flush()
    client.shutdown()
    spans = {s["name"]: s for s in stored_spans(receiver.folder)}
    assert set(spans) == {"agent", "chat"}
    attrs = {a["key"]: a["value"] for a in spans["chat"]["attributes"]}
    assert attrs["langfuse.observation.type"] == {"stringValue": "generation"}
    assert json.dumps(attrs).count("sess-1") and json.dumps(attrs).count("acme")
    stored = b"".join(p.read_bytes() for p in receiver.folder.iterdir() if p.is_file())
    basic = base64.b64encode(b"pk-lf-test:sk-lf-do-not-store")
    assert b"sk-lf-do-not-store" not in stored and basic not in stored
