"""A loopback OTLP/HTTP trace receiver for tests: what a Langfuse server's `/api/public/otel/v1/traces` (or a
collector's `/v1/traces`) is sent, written as a collector's file exporter writes it (OTLP/JSON lines, hex ids).
It checks that a request came with credentials but keeps none of its headers."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from tests.helpers import AppThread
from tests.tracing.agent import otlp_json

PATHS = ("/api/public/otel/v1/traces", "/v1/traces")


class Receiver:
    def __init__(self, out: Path):
        from aiohttp import web

        self.out, self.requests, self.authorized = out, 0, 0
        app = web.Application(client_max_size=64 << 20)
        for path in PATHS:
            app.router.add_post(path, self._traces)
        self.thread = AppThread(app)
        self.root = f"http://127.0.0.1:{self.thread.port}"

    async def _traces(self, request):
        from aiohttp import web
        from google.protobuf.json_format import MessageToDict
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        body = await request.read()  # aiohttp undoes Content-Encoding itself (the SDK sends gzip)
        if body[:2] == b"\x1f\x8b":
            body = gzip.decompress(body)
        message = ExportTraceServiceRequest()
        message.ParseFromString(body)
        self.requests += 1
        self.authorized += request.headers.get("Authorization", "").startswith("Basic ")
        with self.out.open("a") as fh:
            fh.write(json.dumps(otlp_json(MessageToDict(message))) + "\n")
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    def close(self) -> None:
        self.thread.close()
