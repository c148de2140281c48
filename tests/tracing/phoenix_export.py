"""Recorded OTLP/JSON spans turned into what Phoenix's REST API (`GET /v1/projects/{project}/spans`) returns for
them, following Phoenix's own ingestion and export (src/phoenix/server/api/routers/v1/spans.py,
src/phoenix/trace/attributes.py): JSON-string attributes (`metadata`, `tool.parameters`,
`llm.prompt_template.variables`, `document.metadata`) are parsed into objects when stored; the export flattens
objects and lists of objects into dotted keys, moves `openinference.span.kind` into `span_kind` (UNKNOWN when
absent) and writes times as ISO 8601 with microseconds, ids as hex and `id` as the span's global id."""

from __future__ import annotations

import base64
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

from toolaudit.ingest.formats.otlp import key_values

_JSON_STRING_ATTRIBUTES = ("document.metadata", "llm.prompt_template.variables", "metadata", "tool.parameters")
_STATUS = {"STATUS_CODE_OK": "OK", "STATUS_CODE_ERROR": "ERROR"}  # protobuf's JSON names the enum


def _flatten(value, prefix: str, out: dict) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(item, f"{prefix}.{key}" if prefix else key, out)
    elif isinstance(value, list) and any(isinstance(v, dict) for v in value):
        for index, item in enumerate(value):
            if isinstance(item, dict):
                _flatten(item, f"{prefix}.{index}", out)
    elif value is not None:
        out[prefix] = value


def _iso(nanos: str | int) -> str:
    micros = int(nanos) // 1000
    moment = datetime.fromtimestamp(micros // 1_000_000, tz=timezone.utc) + timedelta(microseconds=micros % 1_000_000)
    return moment.isoformat().replace("+00:00", "Z")


def phoenix_spans(otlp_file: Path) -> list[dict]:
    """Every span of a collector-style OTLP/JSON file (hex ids) as Phoenix's REST API gives it."""
    out, rowid = [], 0
    for line in otlp_file.read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    rowid += 1
                    stored = {}
                    for key, value in key_values(span.get("attributes"), "attributes").items():
                        if key.endswith(_JSON_STRING_ATTRIBUTES) and isinstance(value, str):
                            parsed = json.loads(value)
                            if not parsed:
                                continue
                            value = parsed
                        stored[key] = value
                    attributes: dict = {}
                    _flatten(stored, "", attributes)
                    out.append({
                        "id": base64.b64encode(f"Span:{rowid}".encode()).decode(),
                        "name": span["name"],
                        "context": {"trace_id": span["traceId"], "span_id": span["spanId"]},
                        "span_kind": attributes.pop("openinference.span.kind", "UNKNOWN"),
                        "parent_id": span.get("parentSpanId") or None,
                        "start_time": _iso(span["startTimeUnixNano"]),
                        "end_time": _iso(span["endTimeUnixNano"]),
                        "status_code": _STATUS.get(span.get("status", {}).get("code"), "UNSET"),
                        "status_message": span.get("status", {}).get("message", ""),
                        "attributes": attributes,
                        "events": [],
                    })
    return out


def nested(attributes: dict) -> dict:
    """Dotted attributes as nested objects (digit parts as list indices), as Phoenix stores them."""
    root: dict = {}
    for key, value in attributes.items():
        node, parts = root, key.split(".")
        for part, after in zip(parts, parts[1:]):
            if isinstance(node, list):
                while len(node) <= int(part):
                    node.append({})
                node = node[int(part)]
            else:
                node = node.setdefault(part, [] if after.isdigit() else {})
        node[parts[-1]] = value
    return root
