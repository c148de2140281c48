"""A sampled call's rows: every sample of both sides in `samples`, and the call's distribution test in
`sampled_calls` (`compare.distributions.call_test` over the samples' outcomes, `compare.outcomes`).

Written in the chunk's transaction with the call's `calls` row (sample 0's pair), so a resume neither loses nor
doubles a call's samples. The test's resampling seed comes from the call's key: a rerun gives the same p-value.
"""

from __future__ import annotations

import hashlib

from toolaudit.compare.distributions import call_test
from toolaudit.compare.outcomes import SampleOutcome
from toolaudit.compare.pairs import SideOutput, recorded_tool
from toolaudit.engines import EngineResult
from toolaudit.engines.paths import PathConfig
from toolaudit.ingest.traces import TraceCall
from toolaudit.replay.evidence import side_output
from toolaudit.replay.runs import Member
from toolaudit.store import RowBuffer, json_text


def test_seed(call: TraceCall) -> int:
    """The permutation test's seed for a call: fixed by its key, so a rerun or resume gives the same p-value."""
    key = f"{call.session_id}\x1f{call.call_index}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "big")


def write_samples(rows: RowBuffer, m: Member, call: TraceCall, side: str, path: PathConfig,
                  results: list[EngineResult], first: SideOutput) -> list[SampleOutcome]:
    """One `samples` row per sample of one side; returns their outcomes in sample order. `first`: sample 0 as the
    call's pair already parsed it."""
    outcomes = []
    for i, result in enumerate(results):
        out = first if i == 0 else side_output(result, path, 0.0)
        outcome = m.analyzer.sample_outcome(call.tools, out, result.error)
        outcomes.append(outcome)
        rows.add("samples", run_id=m.run_id, session_id=call.session_id, call_index=call.call_index, side=side,
                 sample_index=i, path_name=path.name, outcome=outcome.outcome, outcome_kind=outcome.kind.value,
                 tool_name=outcome.tool_name,
                 arguments=None if outcome.arguments is None else json_text(outcome.arguments),
                 text=out.raw, completion_tokens=result.completion_tokens, finish_reason=result.finish_reason,
                 error=result.error, drafted_tokens=result.drafted_tokens, accepted_tokens=result.accepted_tokens,
                 forward_passes=result.forward_passes)
    return outcomes


def write_call_test(rows: RowBuffer, m: Member, call: TraceCall, base: list[SampleOutcome],
                    cand: list[SampleOutcome]) -> None:
    """The call's `sampled_calls` row: the test over the samples a test may use (not truncated, not failed)."""
    b = [o.outcome for o in base if o.kind.tested]
    c = [o.outcome for o in cand if o.kind.tested]
    # Keyed by the recorded call's tool, as the greedy views key theirs (`calls.recorded_tool`), not by a name one
    # decode path invented; where nothing was recorded, the baseline's most frequent tool.
    if call.response_message is not None:
        tool = recorded_tool(call.response_message)
    else:
        tools = [o.tool_name for o in base if o.tool_name and o.kind.tested]
        tool = max(sorted(set(tools)), key=tools.count) if tools else None
    test = call_test(b, c, seed=test_seed(call))
    rows.add("sampled_calls", run_id=m.run_id, session_id=call.session_id, call_index=call.call_index,
             customer=call.customer, tool_name=tool, n_baseline=test.n_baseline, n_candidate=test.n_candidate,
             outcomes=test.outcomes, statistic=test.statistic, p_value=test.p_value, tv=test.tv,
             tv_low=test.tv_low, tv_high=test.tv_high)
