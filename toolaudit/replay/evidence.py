"""Engine results as the analysis sees them: parsed outputs with their decode evidence, and the first token
at which two paths diverge (with the top-2 margins there: the near-tie evidence)."""

from __future__ import annotations

from collections.abc import Callable

import orjson

from toolaudit.compare.pairs import Divergence, SideOutput, message_raw_text
from toolaudit.engines import EngineResult
from toolaudit.engines.paths import PathConfig
from toolaudit.validate.toolcalls import parse_message, parse_text


def side_output(result: EngineResult, path: PathConfig, wall_share: float,
                request_digest: str | None = None) -> SideOutput:
    """An engine result as the analysis sees it, with its decode evidence for the outputs table, its finish reason
    and the digest of the request it answers (`compare.request_digest`: both paths of a replay decode the same
    recorded request, so their digests agree by construction)."""
    if result.message is not None:
        parsed, raw = parse_message(result.message), message_raw_text(result.message)
    else:
        parsed, raw = parse_text(result.text), result.text
    evidence = {
        "token_ids": result.token_ids or None, "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens, "latency_s": result.latency_s, "ttft_s": result.ttft_s,
        "tokens_per_s": result.completion_tokens / wall_share if wall_share > 0 else None,
        "wall_share_s": wall_share if wall_share > 0 else None,
        "drafted_tokens": result.drafted_tokens, "accepted_tokens": result.accepted_tokens,
        "forward_passes": result.forward_passes, "error": result.error,
    }
    return SideOutput(parsed, raw, path.name, system_fingerprint=result.system_fingerprint, extra=evidence,
                      finish_reason=result.finish_reason, request_digest=request_digest)


def first_divergence(base: EngineResult, cand: EngineResult,
                     decode: Callable[[list[int]], str] | None) -> Divergence | None:
    """The first differing generated token (position, both tokens, both top-2 margins), or None when the token
    streams agree or either side has no token evidence.

    Token ids are compared when both sides have them; otherwise the token strings (`EngineResult.tokens`, e.g.
    from an HTTP endpoint's logprobs) when both sides have those."""
    a: list = base.token_ids
    b: list = cand.token_ids
    by_text = not a or not b
    if by_text:
        a, b = base.tokens, cand.tokens
    if not a or not b or a == b:
        return None
    n = min(len(a), len(b))
    pos = next((i for i in range(n) if a[i] != b[i]), n)

    def token(seq: list) -> str | None:
        if pos >= len(seq):
            return None
        if by_text:
            return seq[pos]
        return decode([seq[pos]]) if decode else str(seq[pos])

    def margin(result: EngineResult) -> float | None:
        return float(result.margins[pos]) if pos < len(result.margins) else None

    return Divergence(pos, token(a), token(b), margin(base), margin(cand))


def results_from_json(text: str) -> list[EngineResult]:
    """A staged call's results: one result, or a sampled path's samples (a JSON array)."""
    data = orjson.loads(text)
    return [_result(d) for d in data] if isinstance(data, list) else [_result(data)]


def _result(data: dict) -> EngineResult:
    data["top2"] = [tuple(pair) for pair in data.get("top2") or ()]
    known = EngineResult.__dataclass_fields__
    return EngineResult(**{k: v for k, v in data.items() if k in known})


