"""`toolaudit collect`: the OTLP/HTTP receiver."""

from __future__ import annotations

import click

from toolaudit.cli.common import friendly_errors


@click.command()
@click.option("--dir", "folder", default="collected", show_default=True, type=click.Path(file_okay=False),
              help="Folder of the collected OTLP/JSON files (one per hour: traces-YYYYMMDDTHH.jsonl, UTC).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (loopback by default).")
@click.option("--port", default=4318, show_default=True, type=click.IntRange(0, 65535),
              help="Port to bind (4318 is OTLP/HTTP's); 0 picks a free one (the address is printed on stderr).")
@click.option("--max-body-bytes", default=32 << 20, show_default=True, type=click.IntRange(1),
              help="Largest request body accepted (decompressed); larger ones are answered 413.")
@friendly_errors
def collect(folder: str, host: str, port: int, max_body_bytes: int) -> None:
    """Receive OTLP/HTTP traces (POST /v1/traces, protobuf or JSON) and keep their model-call spans on disk.

    Point an OTel exporter or collector at http://HOST:PORT (the Langfuse SDK at its
    /api/public/otel path). Each request's LLM spans are fsynced before it is answered; other spans are
    dropped. Replay a sample later with `toolaudit replay --collected DIR`."""
    from toolaudit.collect.receiver import collect as run_receiver

    run_receiver(folder, host=host, port=port, max_body=max_body_bytes)
