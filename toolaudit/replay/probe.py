"""Probe fingerprints: what a decode path *does*, where the config fingerprint (`engines.fingerprint`) says what
it is configured to be. A kernel, driver or server setting the path does not name changes the first, not the
second.

A probe decodes a fixed probe set (`probe_set`) greedily, `repeats` times, through the path with its
decoding pinned (`probe_path`: temperature 0, the probe's own token budget, no few-shot examples and no prefix
cache, so that the probe is short and its prompts meet no earlier state), and hashes:

- `decisions`: SHA-256 of the chosen tokens of every prompt (ids, or token strings from an endpoint);
- `numerics`: SHA-256 of every step's top-k (token, logprob) pairs, each value as `float.hex` of the number the
  engine computed or returned (bit for bit); None when the engine returned no logprobs (an endpoint with them
  disabled, e.g. during speculation): the probe then fingerprints tokens only, and says so.

Repeats that are not bit-identical (a nondeterministic endpoint) are not hidden behind a hash: `stable` is false
and the jitter is measured, the max and median |delta logprob| over the entries that moved between the first
repeat and the others (the hashes are then the first repeat's).

A probe with a deadline (`deadline_s`: a run's probe of an endpoint, `probes.record_run_probes`) sets the path
key WITHIN_KEY, which an engine that can keep one declares (`Capabilities.overrides`; the openai engine's
`within_s`): its requests then go one at a time, one attempt each, all within the deadline, none after the first
failure. An engine that declares no such key is not probed that way (`ProbeError`: the probe is unavailable).
"""

from __future__ import annotations

import hashlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from toolaudit import ToolauditError, __version__
from toolaudit.engines import Engine, EngineResult, make_engine
from toolaudit.engines.fingerprint import fingerprint
from toolaudit.engines.paths import PathConfig, PromptConfig
from toolaudit.engines.registry import ENGINES
from toolaudit.replay.probe_set import ProbeSet

Factory = Callable[[PathConfig], Engine]
WITHIN_KEY = "within_s"  # the path key that bounds an engine's generate() call (see the module docstring)
# Component names that are versions: stored with a probe (`engine_versions`), to say what changed.
VERSION_KEYS = ("torch", "transformers", "vllm", "vllm_distribution", "system_fingerprint", "cpu_capability",
                "device", "platform")


class ProbeError(ToolauditError):
    """The probe could not be decoded (a prompt failed on the path): there is no fingerprint to give."""


@dataclass(frozen=True)
class PromptTrace:
    """One probe prompt as the first repeat decoded it: the chosen tokens, their logprobs, the top-1 minus
    top-2 logprob margins and each step's top-k pairs (empty lists where the engine gave no logprobs)."""

    tokens: list[int | str]
    logprobs: list[float | None]
    margins: list[float]
    top: list[list[tuple[int | str, float]]]

    def as_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "logprobs": self.logprobs, "margins": self.margins,
                "top": [[list(pair) for pair in step] for step in self.top]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PromptTrace:
        return cls(list(data["tokens"]), list(data["logprobs"]), list(data["margins"]),
                   [[(t, v) for t, v in step] for step in data["top"]])


@dataclass
class Probe:
    """A probe fingerprint of one path, as stored in `probes` (`row`) and printed by `fingerprint --probe`."""

    path_name: str
    engine: str
    config_fingerprint: str
    probe_set: str
    prompts: int
    repeats: int
    decisions: str
    numerics: str | None
    stable: bool
    jitter_max: float | None
    jitter_median: float | None
    seconds: float  # decoding the probe set `repeats` times (loading excluded)
    load_seconds: float = 0.0
    engine_versions: dict[str, Any] = field(default_factory=dict)
    traces: list[PromptTrace] = field(default_factory=list)
    unstable_prompts: list[int] = field(default_factory=list)
    note: str | None = None  # e.g. "the endpoint returned no logprobs: tokens only"
    source: str = "bundled"  # the probe set's: "bundled" or the probe file's path
    probe_id: int | None = None
    toolaudit_version: str = __version__

    def row(self, run_id: int | None = None, side: str | None = None) -> dict[str, Any]:
        """The `probes` row (probe_id and created_at are the store's)."""
        detail = {"load_seconds": self.load_seconds, "note": self.note, "unstable_prompts": self.unstable_prompts,
                  "source": self.source, "prompts": [t.as_dict() for t in self.traces]}
        return {"run_id": run_id, "side": side, "path_name": self.path_name, "engine": self.engine,
                "config_fingerprint": self.config_fingerprint, "probe_set": self.probe_set, "prompts": self.prompts,
                "repeats": self.repeats, "decisions": self.decisions, "numerics": self.numerics,
                "stable": self.stable, "jitter_max": self.jitter_max, "jitter_median": self.jitter_median,
                "seconds": self.seconds, "toolaudit_version": self.toolaudit_version,
                "engine_versions": orjson.dumps(self.engine_versions).decode(),
                "detail": orjson.dumps(detail).decode()}

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Probe:
        detail = orjson.loads(row["detail"]) if row.get("detail") else {}
        return cls(row["path_name"], row["engine"], row["config_fingerprint"], row["probe_set"], row["prompts"],
                   row["repeats"], row["decisions"], row["numerics"], bool(row["stable"]), row["jitter_max"],
                   row["jitter_median"], row["seconds"] or 0.0, detail.get("load_seconds", 0.0),
                   orjson.loads(row["engine_versions"]) if row.get("engine_versions") else {},
                   [PromptTrace.from_dict(p) for p in detail.get("prompts", [])],
                   detail.get("unstable_prompts", []), detail.get("note"), detail.get("source", "bundled"),
                   row.get("probe_id"),
                   row.get("toolaudit_version") or "")

    def as_dict(self) -> dict[str, Any]:
        """What `fingerprint --probe --json` prints of it."""
        return {"path": self.path_name, "engine": self.engine, "fingerprint": self.config_fingerprint,
                "decisions": self.decisions, "numerics": self.numerics, "stable": self.stable,
                "jitter": None if self.stable else {"max": self.jitter_max, "median": self.jitter_median,
                                                    "prompts": len(self.unstable_prompts)},
                "prompts": self.prompts, "repeats": self.repeats, "probe_set": self.probe_set,
                "seconds": round(self.seconds, 3), "load_seconds": round(self.load_seconds, 3), "note": self.note,
                "probe_id": self.probe_id}


def probe_path(path: PathConfig, max_tokens: int) -> PathConfig:
    """The path as a probe decodes it: greedy, `max_tokens`, one sample; on engines that render prompts in this
    process, no few-shot examples (short prompts: prefill is most of a probe's cost on CPU) and no prefix cache
    (no prompt meets KV an earlier decode left). An endpoint's server decides those itself."""
    path = replace(path, temperature=0.0, max_tokens=max_tokens, samples=1)
    if not ENGINES.spec(path.engine, f"paths.{path.name}").capabilities.in_process:
        return path
    return replace(path, prefix_caching=False, prompt=PromptConfig(few_shot=0, prefill=path.prompt.prefill))


def probe(path: PathConfig, probe_set: ProbeSet, repeats: int = 2, factory: Factory = make_engine,
          config_fingerprint: str | None = None, deadline_s: float | None = None) -> Probe:
    """Decode `probe_set` greedily `repeats` times through `path` (an engine of its own, closed afterwards) and
    fingerprint what came out. `config_fingerprint`: the path's, when the caller has it (else computed here).
    `deadline_s`: every request of every repeat within that many seconds in all, one attempt each, none sent after
    a failure (the path key WITHIN_KEY; for endpoints); a probe that does not finish is a `ProbeError`."""
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    config_fingerprint = config_fingerprint or fingerprint(factory(path).fingerprint_components())
    decoded = probe_path(path, max(probe_set.max_tokens))
    if deadline_s is not None:
        if WITHIN_KEY not in ENGINES.spec(path.engine, f"paths.{path.name}").capabilities.overrides:
            raise ProbeError(f"path {path.name}: the {path.engine} engine cannot bound a probe's requests (it "
                             f"declares no {WITHIN_KEY} key): not probed")
        decoded = replace(decoded, options={**decoded.options, WITHIN_KEY: deadline_s})
    engine = factory(decoded)
    try:
        t0 = time.perf_counter()
        engine.load()
        load_seconds = time.perf_counter() - t0
        t0 = time.perf_counter()
        if deadline_s is None:
            runs = [engine.generate(list(probe_set.requests)) for _ in range(repeats)]
        else:  # one call, so one deadline covers every repeat
            n = len(probe_set)
            flat = engine.generate([replace(r, key=f"{r.key}.{k}") for k in range(repeats)
                                    for r in probe_set.requests])
            runs = [flat[k * n:(k + 1) * n] for k in range(repeats)]
        seconds = time.perf_counter() - t0
        versions = {k: v for k, v in engine.fingerprint_components().items() if k in VERSION_KEYS}
    finally:
        engine.close()
    failed = [(i, r.error) for run in runs for i, r in enumerate(run) if r.error]
    if failed:
        i, error = failed[0]
        raise ProbeError(f"path {path.name}: probe prompt {i + 1} of {len(probe_set)} failed: {error}")
    traces = [[trace(r, n) for r, n in zip(run, probe_set.max_tokens)] for run in runs]
    first = traces[0]
    numeric = all(t.top for t in first)
    unstable = sorted({i for other in traces[1:] for i, (a, b) in enumerate(zip(first, other)) if a != b})
    deltas = [d for other in traces[1:] for a, b in zip(first, other) for d in logprob_deltas(a, b) if d != 0]
    note = None if numeric else (f"the {engine.name} engine returned no logprobs: the probe fingerprints the "
                                 "chosen tokens only (numerics = None)")
    return Probe(path.name, path.engine, config_fingerprint, probe_set.digest, len(probe_set), repeats,
                 decisions_hash(first), numerics_hash(first) if numeric else None, not unstable,
                 max(deltas) if deltas else (None if not unstable else 0.0),
                 statistics.median(deltas) if deltas else (None if not unstable else 0.0),
                 seconds, load_seconds, versions, first, unstable, note, probe_set.source)


def trace(result: EngineResult, max_tokens: int) -> PromptTrace:
    """One result as a `PromptTrace`, cut to the prompt's own token budget. An endpoint that returned no
    logprobs gives no tokens either: its answer's text stands for them."""
    tokens: list[int | str] = list(result.token_ids or result.tokens)[:max_tokens] or [result.text]
    top = [list(step) for step in result.top_logprobs[:len(tokens)]]
    if len(top) < len(tokens):  # logprobs missing for some steps: none at all rather than a shifted list
        top = []
    logprobs = [dict(step).get(t) for t, step in zip(tokens, top)]  # None: chosen outside the top k (sampled)
    margins = [step[0][1] - step[1][1] if len(step) > 1 else 0.0 for step in top]
    return PromptTrace(tokens, logprobs, margins, top)


def decisions_hash(traces: list[PromptTrace]) -> str:
    return "dec-" + _sha([t.tokens for t in traces])


def numerics_hash(traces: list[PromptTrace]) -> str:
    return "num-" + _sha([[[[tok, float(v).hex()] for tok, v in step] for step in t.top] for t in traces])


def _sha(value: Any) -> str:
    return hashlib.sha256(orjson.dumps(value)).hexdigest()[:16]


def logprob_deltas(a: PromptTrace, b: PromptTrace) -> list[float]:
    """|delta logprob| of the top-k entries two decodes of one prompt share (same step, same token), over the
    steps both took while their chosen tokens agreed (after a flip the contexts differ)."""
    out = []
    for i, (sa, sb) in enumerate(zip(a.top, b.top)):
        other = dict(sb)
        out += [abs(v - other[t]) for t, v in sa if t in other]
        if i < len(a.tokens) and i < len(b.tokens) and a.tokens[i] != b.tokens[i]:
            break
    return out

