"""One chunk's engine results as rows: each engine call's timings (`replay_chunks`), each call pair through the
`Analyzer` (calls, outputs, argument diffs; a pair with an answer cut at max_tokens is stored as truncated, not
compared; each calls row names the tool of the trace's recorded call, `recorded_tool`), failed calls as error
rows that a resume retries. Rows go into a `RowBuffer` that the schedule stores in one transaction with the rest
of the chunk."""

from __future__ import annotations

from toolaudit.compare.pairs import recorded_tool, write_call, write_output
from toolaudit.compare.request_digest import digest_hex
from toolaudit.engines import EngineResult
from toolaudit.engines.paths import PathConfig
from toolaudit.ingest.traces import TraceCall, TraceLineError
from toolaudit.replay.engine_pool import EnginePool
from toolaudit.replay.evidence import first_divergence, side_output
from toolaudit.replay.runs import Member
from toolaudit.replay.sample_rows import write_call_test, write_samples
from toolaudit.store import RowBuffer, Store
from toolaudit.store.vocabulary import MatchStatus


class ChunkRows:
    def __init__(self, store: Store, baseline: PathConfig, candidates: list[PathConfig], engines: EnginePool):
        self.store, self.baseline, self.candidates, self.engines = store, baseline, candidates, engines
        self._next_chunk: dict[int, int] = {}

    def timing(self, rows: RowBuffer, run_id: int, side: str, path: PathConfig, groups: list[list[EngineResult]],
               wall: float, chunk_no: int | None = None) -> int:
        """A `replay_chunks` row (timings of one engine call, or a member's share of it) among the chunk's rows.
        `wall`: the seconds the path is charged (`engines.charged_seconds`: with the prefill it reused).
        `groups`: each call's results (its samples); tokens and counters sum over every sample."""
        if chunk_no is None:
            chunk_no = self._chunk_no(run_id)
        results = [r for group in groups for r in group]
        rows.add("replay_chunks", run_id=run_id, chunk_no=chunk_no, side=side, path_name=path.name,
                 calls=len(groups), wall_s=wall, completion_tokens=sum(r.completion_tokens for r in results),
                 drafted_tokens=sum(r.drafted_tokens for r in results),
                 accepted_tokens=sum(r.accepted_tokens for r in results),
                 forward_passes=sum(r.forward_passes for r in results),
                 errors=sum(1 for r in results if r.error),
                 reused_prefill_s=sum(r.reused_prefill_s for r in results))
        return chunk_no

    def baseline_timings(self, rows: RowBuffer, members: list[Member], chunk: list[TraceCall],
                         results: list[list[EngineResult]], wall: float) -> dict[int, int]:
        """The shared baseline's timings, recorded in each candidate's run (prorated to the calls it lacks),
        so every candidate run reads on its own with the baseline it was measured against. Returns each run's
        chunk number (a call-major chunk's candidate row shares it)."""
        numbers = {}
        for m in members:
            mine = [r for c, r in zip(chunk, results) if c.key in m.todo]
            if mine:
                numbers[m.run_id] = self.timing(rows, m.run_id, "baseline", self.baseline, mine,
                                                wall * len(mine) / len(chunk))
        return numbers

    def _chunk_no(self, run_id: int) -> int:
        if run_id not in self._next_chunk:
            self._next_chunk[run_id] = self.store.next_chunk_no(run_id)
        self._next_chunk[run_id] += 1
        return self._next_chunk[run_id] - 1

    def pairs(self, m: Member, chunk: list[TraceCall], base: list[list[EngineResult]],
              cand: list[list[EngineResult]], shares: tuple[list[float], list[float]], rows: RowBuffer) -> None:
        """Rows for each call of a chunk in one candidate's run (`base[i]`, `cand[i]`: call i's samples); failed
        calls become error rows. Sample 0 is the pair `calls` and `outputs` hold; a sampled run also stores
        every sample and the call's distribution test (`sample_rows`)."""
        decode = self.engines.decoder([self.baseline, *self.candidates])
        sampled = self.baseline.samples > 1 or m.path.samples > 1
        for i, call in enumerate(chunk):
            b_res, c_res = base[i][0], cand[i][0]
            recorded = recorded_tool(call.response_message)  # the trace's call: what per-tool figures key by
            # a call's share of its engine call's wall time: batched decoding has no per-request wall time
            digest = digest_hex(call.request)
            b_out = side_output(b_res, self.baseline, shares[0][i], digest)
            c_out = side_output(c_res, m.path, shares[1][i], digest)
            if b_res.error or c_res.error:
                m.errors += 1
                message = "; ".join(f"{side}: {r.error}" for side, r in (("baseline", b_res), ("candidate", c_res))
                                    if r.error)
                write_call(rows, m.run_id, call.session_id, call.call_index, MatchStatus.ERROR,
                           customer=call.customer, detail=message, recorded_tool=recorded)
                write_output(rows, m.run_id, call.session_id, call.call_index, "baseline", b_out.row())
                write_output(rows, m.run_id, call.session_id, call.call_index, "candidate", c_out.row())
                continue
            m.analyzer.pair(rows, call.session_id, call.call_index, call.customer, call.tools, b_out, c_out,
                            first_divergence(b_res, c_res, decode), recorded=recorded)
            if sampled:
                b_samples = write_samples(rows, m, call, "baseline", self.baseline, base[i], b_out)
                c_samples = write_samples(rows, m, call, "candidate", m.path, cand[i], c_out)
                write_call_test(rows, m, call, b_samples, c_samples)
        m.analyzer.flush_issues(rows)

    def trace_errors(self, run_id: int, bad_lines: list[TraceLineError]) -> None:
        """The input's bad lines, stored once per run (replaced on resume, never doubled)."""
        rows = RowBuffer()
        for err in bad_lines:
            rows.add("trace_errors", run_id=run_id, side="input", source=err.source, line=err.line,
                     field=err.field, message=err.message, excerpt=err.excerpt)
        self.store.replace_trace_errors(run_id, rows)
