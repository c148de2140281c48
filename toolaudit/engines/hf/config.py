"""The hf engine's own `[paths.NAME]` keys, validated without importing torch or transformers (paths.toml is
read before any model loads). Model, dtype, device, batch size, sampling, speculative, prompt and stop are
common keys (`toolaudit.engines.paths`); `prefix_caching` is accepted and ignored (generate() has none).

- `batch = "per_prompt" | "padded"`: how prompts reach `generate()`. "per_prompt" (default) calls it once per
  prompt, as offline eval harnesses usually do; "padded" passes left-padded batches of the path's `batch_size`
  (a padded row is a different numerical path from the same prompt alone). transformers' assisted generation
  (prompt lookup, draft model) runs batch size 1 only, so "padded" with `speculative` is refused.
- `attention = "sdpa" | "eager" | "toolaudit"`: the attention the model runs. "sdpa" (default) is what
  `from_pretrained` picks on its own, i.e. what an eval harness runs; the model is a copy loaded for hf paths.
  "toolaudit" runs generate() on the torch engine's own shared model (asked of the torch engine through the
  registry; its grouped attention): same weights object and kernels as torch paths, only the decode loop
  differs.
- `threads`: torch threads while this path runs (default: $OMP_NUM_THREADS, else the cores the process may use
  that other processes leave free, `engines.threads`).
- `num_assistant_tokens_schedule = "constant" | "heuristic" | "heuristic_transient"` (draft_model only):
  how the draft's proposal count moves between verification passes; default "constant" (always
  `speculative.num_speculative_tokens`, as vLLM and the torch engine). Reset at each request.
- `assistant_confidence_threshold` (draft_model only, 0 <= x < 1): the draft stops proposing when its top
  probability falls below this; default 0 (off, so every pass proposes `num_speculative_tokens`). transformers'
  own default is 0.4.
- `generate_args`: a table passed to `generate()` as is after the path's own arguments (e.g.
  `{top_k = 50, repetition_penalty = 1.1}` to match a harness's settings); it may not repeat what the path
  decides (max_new_tokens, do_sample, temperature, prompt lookup, assistant, stop strings, scores, ...), nor
  top_k or top_p where the path sets them. A sampled padded path draws rows with its own seeded draw, which
  applies temperature, top_k and top_p only, so other sampling warpers (min_p, typical_p, ...) need
  `batch = "per_prompt"`.

Speculative methods: "ngram" -> `prompt_lookup_num_tokens = num_speculative_tokens` and
`max_matching_ngram_size = prompt_lookup_max` (transformers always falls back down to 1-gram matches, so
`prompt_lookup_min` must be 1); "draft_model" -> `assistant_model` (`speculative.model`, same tokenizer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toolaudit import ConfigError

from ..base import Capabilities
from ..options import Fail, key
from ..registry import EngineSpec

SPEC_METHODS = ("ngram", "draft_model")
BATCH_MODES = ("per_prompt", "padded")
ATTENTIONS = ("sdpa", "eager", "toolaudit")
SCHEDULES = ("constant", "heuristic", "heuristic_transient")


@dataclass(frozen=True)
class HFOptions:
    """The hf engine's own keys (every one stored with its default: `PathConfig.options` holds them all)."""

    batch: str = key("per_prompt", allowed=BATCH_MODES, doc="one generate() per prompt, or padded batches")
    attention: str = key("sdpa", allowed=ATTENTIONS, doc="the attention the model runs")
    threads: int | None = key(None, low=1, doc="torch threads (None: the free cores, `engines.threads.choose`)")
    num_assistant_tokens_schedule: str = key("constant", allowed=SCHEDULES, doc="draft_model: proposals per pass")
    assistant_confidence_threshold: float = key(0.0, low=0, high=1, high_open=True,
                                                doc="draft_model: stop proposing below this top probability")
    generate_args: dict = key({}, what="a table of generate() keyword arguments", doc="passed to generate()")


# generate() arguments the path itself decides: `generate_args` may not set them.
RESERVED_GENERATE_ARGS = frozenset({
    "inputs", "input_ids", "attention_mask", "generation_config", "max_new_tokens", "max_length", "min_length",
    "min_new_tokens", "do_sample", "temperature", "num_beams", "num_return_sequences", "prompt_lookup_num_tokens",
    "max_matching_ngram_size", "assistant_model", "assistant_tokenizer", "assistant_early_exit",
    "num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold", "stop_strings",
    "tokenizer", "eos_token_id", "pad_token_id", "output_scores", "output_logits", "return_dict_in_generate",
    "stopping_criteria", "streamer", "use_cache", "past_key_values",
})

# sampling warpers other than temperature, top-k and top-p (a sampled padded path draws rows itself: engine.py)
OTHER_WARPERS = frozenset({"min_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "top_h"})

def check(opts: HFOptions, table: dict[str, Any], fail: Fail) -> None:
    """What one key cannot say alone: generate_args against what the path decides, the speculative method, and
    keys that need draft_model or per-prompt batches."""
    args = opts.generate_args
    clash = sorted(set(args) & RESERVED_GENERATE_ARGS)
    if clash:
        raise fail(f"generate_args.{clash[0]}", "is decided by the path itself; use the path's keys instead")
    for k in ("top_k", "top_p"):
        if k in args and k in table:
            raise fail(f"generate_args.{k}", f"is given twice: the path's {k} is passed to generate() already")
    warpers = sorted(set(args) & OTHER_WARPERS)
    if warpers and opts.batch == "padded" and table.get("temperature", 0) > 0:
        raise fail(f"generate_args.{warpers[0]}", "cannot be used by a sampled padded path: its rows are drawn "
                                                   "by toolaudit's per-row seeded draw, which applies temperature, "
                                                   "top_k and top_p only (use batch = \"per_prompt\")")
    spec = table.get("speculative")
    method = spec.get("method") if isinstance(spec, dict) else None
    if isinstance(spec, dict):
        _check_speculative(spec, method, fail)
        if opts.batch == "padded":
            raise fail("batch", "'padded' cannot be used with speculative: transformers' assisted generation "
                                "runs one prompt at a time (use batch = \"per_prompt\")")
    for k in ("num_assistant_tokens_schedule", "assistant_confidence_threshold"):
        if k in table and method != "draft_model":
            raise fail(k, "is only used with speculative method draft_model")


def _check_speculative(spec: dict[str, Any], method: str | None, fail: Fail) -> None:
    if method not in SPEC_METHODS:
        raise fail("speculative.method", f"must be one of {', '.join(SPEC_METHODS)} for the hf engine "
                                          f"(got {method!r})")
    model = spec.get("model")
    if method == "draft_model" and (not isinstance(model, str) or not model):
        raise fail("speculative.model", "is required for method draft_model (a model sharing the tokenizer)")
    if method == "ngram":
        if model is not None:
            raise fail("speculative.model", "is only used with method draft_model")
        if spec.get("prompt_lookup_min", 1) != 1:
            raise fail("speculative.prompt_lookup_min", "must be 1 for the hf engine (transformers' prompt "
                                                        "lookup always falls back down to 1-gram matches)")


def check_path(path) -> None:
    """What `check` checks across keys, for a `PathConfig` built in code (`dataclasses.replace`)."""
    opts, spec = ENGINE.read(path.options), path.speculative

    def fail(k: str, message: str) -> ConfigError:
        return ConfigError(f"paths.{path.name}: {k} {message}")

    defaults = HFOptions()
    table: dict[str, Any] = {k: v for k, v in path.options.items() if k in ENGINE.keys
                             and v != getattr(defaults, k)}  # what the path sets
    table.update({k: v for k, v, default in (("temperature", path.temperature, 0.0), ("top_k", path.top_k, 0),
                                             ("top_p", path.top_p, 1.0)) if v != default})
    if spec is not None:
        table["speculative"] = {"method": spec.method, "model": spec.model,
                                "prompt_lookup_min": spec.prompt_lookup_min}
    check(opts, table, fail)


CAPABILITIES = Capabilities(sees_logits=True, decodes_tokens=True, holds_together=True, in_process=True)
ENGINE = EngineSpec(name="hf", factory="toolaudit.engines.hf.engine:HFEngine", options=HFOptions, check=check,
                    capabilities=CAPABILITIES)
KEYS = ENGINE.keys
