"""Trace formats: one module per format, each exposing `FORMAT` (a `TraceFormat`) and registered under the
entry-point group `toolaudit.formats` (toolaudit's own pyproject.toml names the built-in ones; a plug-in
distribution names its own: docs/plugins.md). See docs/formats.md for what each format reads.

This package's namespace is what a plug-in imports to write a reader: the contract (`TraceFormat`, `Sample`),
what a reader returns (`Conversion` of `Call`s with their `Origin`, problems, skipped records), the error a
reader raises for a bad record (`Invalid`), the session/customer keys it is given (`Keys`) and helpers that
build the Chat Completions shapes. Format modules are not imported here: the registry loads them.
"""

from __future__ import annotations

from toolaudit.ingest.formats.base import (
    Call,
    Conversion,
    Invalid,
    Keys,
    Origin,
    Problem,
    arguments_text,
    as_key,
    chat_response,
    chat_tools,
    check_role,
    json_value,
    load_line,
    record_lines,
    text_content,
    tools_from_json,
    usage_block,
)
from toolaudit.ingest.formats.contract import Sample, TraceFormat

__all__ = ["Call", "Conversion", "Invalid", "Keys", "Origin", "Problem", "Sample", "TraceFormat", "arguments_text",
           "as_key", "chat_response", "chat_tools", "check_role", "json_value", "load_line", "record_lines",
           "text_content", "tools_from_json", "usage_block"]
