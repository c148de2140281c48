"""vLLM's outputs and counters as `EngineResult` fields: top-2 margins from ranked logprobs, timings from the
request stats, and drafted/accepted tokens per request (vLLM's per-request spec-decode metrics where present,
else a share of the engine's aggregate counters diffed around the call)."""

from __future__ import annotations

import logging

from ..base import EngineResult
from .compat import spec_metrics

log = logging.getLogger(__name__)


def spec_counters(llm) -> dict[str, int]:
    """vLLM's cumulative speculative counters (0 when speculation is off or stats are disabled)."""
    names = {"vllm:spec_decode_num_draft_tokens": "drafted", "vllm:spec_decode_num_accepted_tokens": "accepted",
             "vllm:spec_decode_num_drafts": "drafts"}
    counts = dict.fromkeys(names.values(), 0)
    try:
        for metric in llm.get_metrics():
            if metric.name in names:
                counts[names[metric.name]] += int(metric.value)  # counters: the names above
    except Exception as exc:
        log.debug("vLLM metrics unavailable: %s", exc)
    return counts


def attribute_spec(results: list[EngineResult], outputs, drafted: int, accepted: int) -> None:
    """Drafted/accepted tokens and forward passes per request: vLLM's per-request spec metrics where present; the
    rest of the call's aggregate counters go to the other requests in proportion to their generated tokens."""
    missing: list[EngineResult] = []
    for result, out in zip(results, outputs):
        m = spec_metrics(out.outputs[0])  # None on a vLLM without per-request figures (0.26: `compat`)
        if m is None:
            missing.append(result)
            continue
        steps = sum(m.histogram)
        result.drafted_tokens = int(m.num_draft_tokens)
        result.accepted_tokens = int(sum(j * n for j, n in enumerate(m.histogram)))
        # prefill pass (first token) + verification passes + plain decode steps where nothing was drafted
        plain = max(0, result.completion_tokens - 1 - steps - result.accepted_tokens)
        result.forward_passes = 1 + steps + plain if result.completion_tokens else 0
    if missing:
        lacking = {id(r) for r in missing}
        drafted -= sum(r.drafted_tokens for r in results if id(r) not in lacking)
        accepted -= sum(r.accepted_tokens for r in results if id(r) not in lacking)
        weights = [max(0, r.completion_tokens - 1) for r in missing]
        for result, d, a in zip(missing, shares(max(0, drafted), weights), shares(max(0, accepted), weights)):
            result.drafted_tokens, result.accepted_tokens = d, a
            result.forward_passes = max(1, result.completion_tokens - a) if result.completion_tokens else 0


def shares(total: int, weights: list[int]) -> list[int]:
    """`total` split in proportion to `weights` as integers that add up to it (largest remainders)."""
    if not weights or sum(weights) == 0:
        return [0] * len(weights)
    raw = [total * w / sum(weights) for w in weights]
    shares = [int(x) for x in raw]
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - shares[i], reverse=True)[: total - sum(shares)]:
        shares[i] += 1
    return shares


def result_from_output(key: str, text: str, out, t0: float) -> EngineResult:
    """One vLLM `RequestOutput` as a result; `text` is the engine's (prefill + decoded tokens, cut at the stop).
    Margins: top-1 minus top-2 logprob (raw log-softmax values, so the difference equals the logit margin)."""
    c = out.outputs[0]
    ids = [int(t) for t in c.token_ids]
    margins, top2 = [], []
    for entry in c.logprobs or []:
        ranked = {lp.rank: (token, lp.logprob) for token, lp in entry.items()}
        (t1, l1), (t2, l2) = ranked.get(1, (-1, float("nan"))), ranked.get(2, (-1, float("nan")))
        margins.append(float(l1 - l2))
        top2.append((int(t1), int(t2)))
    ttft = latency = 0.0
    stats = out.metrics  # None when vLLM keeps no request stats
    if stats is not None and stats.first_token_latency:
        ttft = max(0.0, stats.arrival_time + stats.first_token_latency - t0)
        latency = ttft + max(0.0, stats.last_token_ts - stats.first_token_ts)
    finish = c.finish_reason if c.finish_reason in ("stop", "length") else None
    result = EngineResult(
        key=key, text=text, token_ids=ids, prompt_tokens=len(out.prompt_token_ids or []), completion_tokens=len(ids),
        latency_s=latency, ttft_s=ttft, forward_passes=len(ids), margins=margins, top2=top2, finish_reason=finish,
    )
    if finish is None:
        result.error = f"vLLM finished the request with reason {c.finish_reason!r}"
    return result


def ranked_logprobs(out, k: int) -> list[list[tuple[int, float]]]:
    """Per generated token, vLLM's top-k (token id, logprob) pairs by rank, the values as vLLM returned them;
    nothing when k is 0. (vLLM adds the sampled token when it is outside the top k: left out here.)"""
    if k <= 0:
        return []
    steps = []
    for entry in out.outputs[0].logprobs or []:
        ranked = sorted((lp.rank, int(token), float(lp.logprob)) for token, lp in entry.items()
                        if lp.rank is not None and lp.rank <= k)
        steps.append([(token, value) for _, token, value in ranked])
    return steps
