"""Record the agent sessions through one instrumentation library (one library per interpreter: instrumentations
patch `openai` globally).

    python -m tests.tracing.record LIBRARY MODE --base-url URL [--out spans.jsonl] [--logs-out logs.jsonl]
        [--ids hex|base64] [--pretty] [--otlp-endpoint http://127.0.0.1:4318]

Spans (and the library's log records) are written as a collector's file exporter writes them: OTLP/JSON export
requests, one per line; log records into the same file unless `--logs-out` names another. `--pretty` writes one
indented export request of all spans instead (and logs likewise); `--otlp-endpoint` sends them to an OTLP/HTTP
receiver (`/v1/traces`, `/v1/logs`) with the real exporters, flushed and shut down before the script exits.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tests.tracing.agent import run_sessions, write_spans
from tests.tracing.libraries import setup


def write_logs(records, out: Path, ids: str = "hex", mode: str = "w", per_line: int = 4) -> None:
    """Log records as OTLP/JSON `ExportLogsServiceRequest` lines (ids as hex, or left base64)."""
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs

    records = list(records)
    with out.open(mode) as fh:
        for i in range(0, len(records), per_line):
            fh.write(json.dumps(logs_json(MessageToDict(encode_logs(records[i:i + per_line])), ids)) + "\n")


def logs_json(request: dict, ids: str = "hex") -> dict:
    from tests.tracing.agent import hex_id

    if ids == "hex":
        for rl in request.get("resourceLogs", []):
            for sl in rl.get("scopeLogs", []):
                for record in sl.get("logRecords", []):
                    for key in ("traceId", "spanId"):
                        if record.get(key):
                            record[key] = hex_id(record[key])
    return request


def pretty(out: Path) -> None:
    """Every line's export requests merged into one document per kind, written indented (as json.dump does)."""
    docs: dict[str, list] = {"resourceSpans": [], "resourceLogs": []}
    for line in out.read_text().splitlines():
        record = json.loads(line)
        for kind in docs:
            docs[kind] += record.get(kind, [])
    out.write_text("\n".join(json.dumps({kind: items}, indent=2) for kind, items in docs.items() if items) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("library")
    parser.add_argument("mode")
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--logs-out", type=Path)
    parser.add_argument("--ids", choices=("hex", "base64"), default="hex")
    parser.add_argument("--pretty", action="store_true")
    parser.add_argument("--otlp-endpoint")
    args = parser.parse_args()
    if args.out is None and args.otlp_endpoint is None:
        parser.error("give --out, --otlp-endpoint or both")
    recording = setup(args.library, args.mode, args.otlp_endpoint)
    import openai

    client = openai.OpenAI(base_url=args.base_url, api_key="unused", max_retries=0)
    for _ in run_sessions(client, recording.attach):
        pass
    recording.shutdown()
    if args.out is None:
        return
    write_spans(recording.spans.get_finished_spans(), args.out, args.ids)
    logs = recording.logs.get_finished_logs()
    if logs:
        write_logs(logs, args.logs_out or args.out, args.ids, "w" if args.logs_out else "a")
    if args.pretty:
        pretty(args.out)


if __name__ == "__main__":
    main()

