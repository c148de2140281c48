"""A trace format plug-in for toolaudit: model calls as CSV rows.

    session,customer,prompt,tool,arguments
    s1,acme,close ticket 7,close_ticket,"{""ticket_id"": 7}"

Each row after the header is one call: the user's prompt and the tool call the model answered with (arguments
kept byte for byte). A session's calls are in row order. The format is detected from the header line.
"""

from __future__ import annotations

import csv

from toolaudit.ingest.formats import (
    Call,
    Conversion,
    Invalid,
    Keys,
    Origin,
    Sample,
    TraceFormat,
    chat_response,
    record_lines,
)

HEADER = ["session", "customer", "prompt", "tool", "arguments"]


def detect(sample: Sample) -> bool:
    return sample.raw.strip() == ",".join(HEADER).encode()


def read(path: str, keys: Keys) -> Conversion:
    conv = Conversion("csv")
    for line, raw in record_lines(path, conv):
        conv.records += 1
        try:
            row = next(csv.reader([raw.decode("utf-8")]))
        except (UnicodeDecodeError, csv.Error) as exc:
            conv.problem(line, None, None, f"not a CSV row: {exc}", raw)
            continue
        if row == HEADER:
            conv.skip("header row")
            continue
        try:
            conv.calls.append(_call(row, line))
        except Invalid as exc:
            conv.problem(line, None, exc.field, exc.message, raw)
    return conv


def _call(row: list[str], line: int) -> Call:
    if len(row) != len(HEADER):
        raise Invalid(None, f"expected {len(HEADER)} columns ({','.join(HEADER)}), got {len(row)}")
    session, customer, prompt, tool, arguments = row
    if not session:
        raise Invalid("session", "missing: every call belongs to a session")
    if not tool:
        raise Invalid("tool", "missing: the answer names the tool it calls")
    message = {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{line}", "type": "function", "function": {"name": tool, "arguments": arguments}}]}
    request = {"model": "csv", "messages": [{"role": "user", "content": prompt}]}
    return Call(session, customer or None, request, chat_response(message, None), Origin(line, None, "tool"))


FORMAT = TraceFormat(name="csv", description="model calls as CSV rows: session,customer,prompt,tool,arguments",
                     detect=detect, read=read, record_word="row", looks_like="a CSV row of a model call")
