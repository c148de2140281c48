"""The second step of `compare`: join the staged digests of the two logs by (session, call index), or by request
digest and occurrence (`store.staging`'s pairing modes), and write every call's rows.

The join runs in SQL (`store.staging`). Pairs whose canonical tool calls agree, pairs with an answer cut at
max_tokens (truncated: not compared) and calls in one log only are written there straight from their digests;
the pairs that differ (~1%) and the pairs of different requests (mismatched: not compared, the difference
described from both requests) are re-read from their files by byte offset and go through `pairs.Analyzer` in
Python, and the candidates scanned without validating whose verdict cannot be taken from their baseline are
validated on their own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from toolaudit.compare.pairs import Analyzer, SideOutput, first_tool, message_raw_text
from toolaudit.compare.recorder import Recorder
from toolaudit.compare.request_digest import digest_hex
from toolaudit.ingest.records import finish_reason, system_fingerprint
from toolaudit.ingest.traces import TraceCall
from toolaudit.store.staging import BASELINE_ONLY, CANDIDATE_ONLY, FAST, TRUNCATED, Staging
from toolaudit.store.vocabulary import MISMATCHES_SHOWN, DriftKind, MatchStatus
from toolaudit.validate.toolcalls import parse_message

# (side, line, byte offset, call index) -> the call as recorded, re-read from its file
ReadCall = Callable[[int, int, int, int], TraceCall]
# (candidate line, byte offset) -> (line, schema validity, schema errors as JSON)
Verdict = Callable[[int, int], tuple[int, bool | None, str | None]]


def side_output(call: TraceCall, path_name: str) -> SideOutput:
    """A recorded call's answer, parsed, as one side of a pair."""
    message = call.response_message
    return SideOutput(parsed=parse_message(message), raw=message_raw_text(message), path_name=path_name,
                      source=call.source, line=call.line, system_fingerprint=system_fingerprint(call.response),
                      finish_reason=finish_reason(call.response), request_digest=digest_hex(call.request),
                      request=call.request)


@dataclass
class JoinCounts:
    """How the joined keys were resolved."""

    matched: int = 0
    baseline_only: int = 0
    candidate_only: int = 0
    truncated: int = 0
    mismatched: int = 0
    drifted: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    mismatches: list[dict[str, Any]] = field(default_factory=list)  # the first few: key, lines, what differs

    def kind(self, kind: str, n: int = 1) -> None:
        self.kinds[kind] = self.kinds.get(kind, 0) + n


@dataclass
class Join:
    """Joins one comparison's staged sides and writes its call rows (see the module docstring)."""

    stage: Staging
    recorder: Recorder
    analyzer: Analyzer
    names: tuple[str, str]  # the decode-path names of the two sides
    page: int  # pairs fetched from the stage at a time
    counts: JoinCounts = field(default_factory=JoinCounts)

    def run(self, read_call: ReadCall, verdict: Verdict, sources: tuple[str, str]) -> JoinCounts:
        """`sources`: the two files, as the agreeing pairs' outputs rows name them."""
        how = self.stage.pair()
        for rows in self.stage.differing(self.page):
            for row in rows:
                self._diff(row, read_call)
                self.recorder.flush(self.stage)
        for rows in self.stage.candidates_to_check(self.page):
            self.stage.add_checked([verdict(row["line"], row["offset"]) for row in rows])
        self._take_issues()
        self.recorder.flush(self.stage, force=True)
        self.stage.write_agreeing(self.recorder.run_id, self.names, sources)
        # in a fixed order: a GROUP BY's is not, and the run's counts JSON must not depend on it
        for kind, n in sorted(self.stage.fast_kinds().items()):
            self.counts.kind(kind, n)
        self.counts.matched += how.get(FAST, 0)
        self.counts.baseline_only += how.get(BASELINE_ONLY, 0)
        self.counts.candidate_only += how.get(CANDIDATE_ONLY, 0)
        self.counts.truncated += how.get(TRUNCATED, 0)
        return self.counts

    def _diff(self, row: dict[str, Any], read_call: ReadCall) -> None:
        """A pair whose canonical tool calls or requests differ: re-read both lines and diff in full, or store it
        as mismatched with what differs between the two requests."""
        session_id, call_index = row["session_id"], row["call_index"]
        b_call = read_call(0, row["bl"], row["b_offset"], call_index)
        c_call = read_call(1, row["cl"], row["c_offset"], call_index)
        baseline = side_output(b_call, self.names[0])
        outcome = self.analyzer.pair(self.recorder.rows, session_id, call_index, row["customer"], b_call.tools,
                                     baseline, side_output(c_call, self.names[1]),
                                     recorded=first_tool(baseline.parsed))  # the baseline log is the recording
        self._take_issues()
        if outcome.status is MatchStatus.MISMATCHED:
            self.counts.mismatched += 1
            if len(self.counts.mismatches) < MISMATCHES_SHOWN:
                self.counts.mismatches.append({
                    "session_id": session_id, "call_index": call_index, "baseline_line": b_call.line,
                    "candidate_line": c_call.line, "detail": outcome.detail})
            return
        if outcome.status is MatchStatus.TRUNCATED:  # a staged digest said otherwise: the file changed meanwhile
            self.counts.truncated += 1
            return
        kind = DriftKind(outcome.verdict.kind)
        self.counts.matched += 1
        self.counts.drifted += kind.drifted
        self.counts.kind(kind.value)

    def _take_issues(self) -> None:
        self.recorder.issues(self.analyzer.pending_issues)
        self.analyzer.pending_issues.clear()
