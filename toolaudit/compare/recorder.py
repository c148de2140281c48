"""What a comparison writes besides the agreeing pairs' rows, buffered until the store's staging writes it.

The buffer holds the rows of the pairs diffed in Python (`pairs.Analyzer`), one `trace_errors` row per bad line
(the first three per side are also kept for the error a file without a usable call raises) and each schema
issue once per run (issues arrive from every scanned chunk). `flush` hands the buffer to
`store.staging.Staging.write`, the writer of every row of a compare run.
"""

from __future__ import annotations

from collections.abc import Iterable

from toolaudit.ingest.traces import TraceLineError
from toolaudit.store import RowBuffer
from toolaudit.store.staging import Staging

SIDE_NAMES = ("baseline", "candidate")


class Recorder:
    """The rows of one compare run that are built in Python, written `limit` rows at a time."""

    def __init__(self, run_id: int, limit: int):
        self.run_id, self.limit = run_id, limit
        self.rows = RowBuffer()
        self.first_errors: list[list[TraceLineError]] = [[], []]
        self._issues_seen: set[tuple] = set()

    def error(self, side: int, err: TraceLineError) -> None:
        """A line of side `side` (0 baseline, 1 candidate) that could not be used."""
        if len(self.first_errors[side]) < 3:
            self.first_errors[side].append(err)
        self.rows.add("trace_errors", run_id=self.run_id, side=SIDE_NAMES[side], source=err.source, line=err.line,
                      field=err.field, message=err.message, excerpt=err.excerpt)

    def issues(self, issues: Iterable[dict]) -> None:
        """Schema issues (`{tool_name, schema_source, severity, message}`), each stored once per run."""
        for issue in issues:
            key = tuple(issue.values())
            if key not in self._issues_seen:
                self._issues_seen.add(key)
                self.rows.add("schema_issues", run_id=self.run_id, **issue)

    def flush(self, stage: Staging, force: bool = False) -> None:
        """Write the buffer once it holds `limit` rows (or now, with `force`)."""
        if force or len(self.rows) >= self.limit:
            stage.write(self.rows)
            self.rows = RowBuffer()
