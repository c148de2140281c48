"""Which format a trace file is in, from its first record (the first non-blank line that is a JSON object).

- `{"resourceSpans": [...]}`: an OTLP/JSON export. OpenInference when a span carries
  `openinference.span.kind`, OTel GenAI when one carries a `gen_ai.*` attribute; a first export holding neither
  (e.g. only HTTP spans) defers the choice to the next lines, and OTel is assumed when no line decides.
- `{"request": {...}, "response": ...}`: OpenAI Chat Completions when the request has `messages`, the Responses
  API when it has `input` / `instructions` or the response is `{"object": "response", "output": [...]}`.
- a Langfuse trace (`observations`), observation (`traceId` + `type`), or an API page (`{"data": [...]}`).

A file whose first records are not JSON objects is read as an OpenAI log, whose reader explains each line.
"""

from __future__ import annotations

from typing import Any

from toolaudit.ingest.formats.base import load_line

FORMATS = ("openai", "otel", "openinference", "langfuse", "responses")
LANGFUSE_TYPES = frozenset({"GENERATION", "SPAN", "EVENT", "AGENT", "TOOL", "CHAIN", "RETRIEVER", "EVALUATOR",
                            "EMBEDDING", "GUARDRAIL"})
NAMES = {"openai": "an OpenAI Chat Completions log line", "otel": "an OTel GenAI (OTLP/JSON) export",
         "openinference": "an OpenInference (OTLP/JSON) export", "langfuse": "a Langfuse export record",
         "responses": "a Responses API log line"}
_MAX_LINES = 1000
_MAX_BYTES = 64 << 20


def mixed(record: Any, expected: str) -> str:
    """" (this line looks like <another format>: one format per file)" when it does, else ""."""
    other = describe(record)
    if other is None or other == expected or {other, expected} <= {"otel", "openinference"}:
        return ""
    return f" (this line looks like {NAMES[other]}, but the file is read as {expected}: one format per file)"


def describe(record: Any) -> str | None:
    """The format one parsed record looks like, or None."""
    if not isinstance(record, dict):
        return None
    if isinstance(record.get("resourceSpans"), list):
        return otlp_convention(record) or "otel"
    if "request" in record or "response" in record:
        request, response = record.get("request"), record.get("response")
        if isinstance(request, dict) and "messages" in request:
            return "openai"
        if isinstance(request, dict) and ("input" in request or "instructions" in request):
            return "responses"
        if isinstance(response, dict) and (response.get("object") == "response"
                                           or isinstance(response.get("output"), list)):
            return "responses"
        return "openai"
    if looks_like_langfuse(record):
        return "langfuse"
    data = record.get("data")
    if isinstance(data, list) and data and all(isinstance(d, dict) and looks_like_langfuse(d) for d in data[:5]):
        return "langfuse"
    return None


def looks_like_langfuse(record: dict) -> bool:
    return isinstance(record.get("observations"), list) or (
        "traceId" in record and ("type" in record or "startTime" in record)) or (
        record.get("type") in LANGFUSE_TYPES and "id" in record)


def otlp_convention(record: dict) -> str | None:
    """"openinference" or "otel" from the first span attribute that tells them apart, else None."""
    for rs in record.get("resourceSpans") or []:
        if not isinstance(rs, dict):
            continue
        for scope in rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or []:
            for span in (scope.get("spans") or []) if isinstance(scope, dict) else []:
                attrs = span.get("attributes") if isinstance(span, dict) else None
                for attr in attrs if isinstance(attrs, list) else []:
                    key = attr.get("key") if isinstance(attr, dict) else None
                    if not isinstance(key, str):
                        continue
                    if key.startswith("openinference.") or key.startswith("llm."):
                        return "openinference"
                    if key.startswith("gen_ai."):
                        return "otel"
    return None


def detect_format(path: str) -> tuple[str, int | None]:
    """(format, line that decided it); ("openai", None) when no record decides."""
    pending_otlp: int | None = None
    seen_bytes = seen_lines = 0
    with open(path, "rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            seen_bytes += len(raw)
            if not raw.strip():
                continue
            seen_lines += 1
            if seen_lines > _MAX_LINES or seen_bytes > _MAX_BYTES:
                break
            record, error = load_line(raw)
            if error is not None or not isinstance(record, dict):
                continue
            fmt = describe(record)
            if fmt is None:
                if pending_otlp is None:
                    return "openai", None
                continue
            if fmt in ("otel", "openinference") and isinstance(record.get("resourceSpans"), list):
                decided = otlp_convention(record)
                if decided is None:
                    pending_otlp = pending_otlp or line_no
                    continue
                return decided, line_no
            if pending_otlp is not None:
                break  # the first record was OTLP: a later line of another format does not change that
            return fmt, line_no
    if pending_otlp is not None:
        return "otel", pending_otlp
    return "openai", None
