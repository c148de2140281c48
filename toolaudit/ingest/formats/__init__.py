"""Readers for traffic recorded outside OpenAI Chat Completions logs: OpenTelemetry GenAI and OpenInference
spans (OTLP/JSON), Langfuse exports and Responses API logs. See docs/formats.md.

Each reader turns a whole file into a `Conversion`: calls in the OpenAI-log shape, problems naming the
original line, span (or observation) id and attribute, and skipped records with their reasons. `traces.py`
writes the calls to a temporary OpenAI-shaped log and feeds it to the same machinery as a native log
(`TraceSource`), mapping every line back to where it came from. OpenAI logs themselves are read by
`traces.py` directly; the modules here import nothing from the rest of toolaudit but `deepjson`.
"""

from __future__ import annotations

from collections.abc import Callable

from toolaudit.ingest.formats import langfuse, openinference, otel, responses
from toolaudit.ingest.formats.base import Conversion, Keys, Origin, Problem
from toolaudit.ingest.formats.detect import FORMATS, describe, detect_format, mixed

READERS: dict[str, Callable[[str, Keys], Conversion]] = {
    "otel": otel.read,
    "openinference": openinference.read,
    "langfuse": langfuse.read,
    "responses": responses.read,
}

__all__ = ["FORMATS", "READERS", "Conversion", "Keys", "Origin", "Problem", "convert", "describe",
           "detect_format", "mixed"]


def convert(path: str, fmt: str, keys: Keys) -> Conversion:
    """Read a whole file in a format other than "openai"."""
    return READERS[fmt](str(path), keys)
