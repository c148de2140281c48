"""The face of ingest that the rest of toolaudit imports: reading trace files of any registered format into
`TraceCall`s and error rows (`read_trace`), and the record types themselves.

Where the work is done: `records` (what reading yields), `registry` (the formats: entry points, detection),
`reading` (open a file in its format, read it call by call), `sources` (a file opened for scanning and
re-reading), `held` (calls held in memory as records), `calls` (a reader's call checked into a record),
`formats/` (one module per format, and what they share).
"""

from __future__ import annotations

from toolaudit.ingest.reading import check, open_source, read_trace, use_format
from toolaudit.ingest.records import (
    CALL_INDEX_KEY,
    DEFAULT_CUSTOMER_KEY,
    DEFAULT_SESSION_KEY,
    EXCERPT_CHARS,
    CallIndexer,
    RawCall,
    TraceCall,
    TraceLineError,
    TraceStats,
    first_message,
    line_error,
)
from toolaudit.ingest.sources import TraceSource, open_trace

__all__ = ["CALL_INDEX_KEY", "DEFAULT_CUSTOMER_KEY", "DEFAULT_SESSION_KEY", "EXCERPT_CHARS", "CallIndexer",
           "RawCall", "TraceCall", "TraceLineError", "TraceSource", "TraceStats", "check", "first_message",
           "line_error", "open_source", "open_trace", "read_trace", "use_format"]
