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

from typing import Any, Callable

from toolaudit import ConfigError

from ..base import Capabilities
from ..registry import EngineSpec

SPEC_METHODS = ("ngram", "draft_model")
BATCH_MODES = ("per_prompt", "padded")
ATTENTIONS = ("sdpa", "eager", "toolaudit")
SCHEDULES = ("constant", "heuristic", "heuristic_transient")

KEYS: frozenset[str] = frozenset({
    "batch", "attention", "threads", "num_assistant_tokens_schedule", "assistant_confidence_threshold",
    "generate_args",
})

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

DEFAULTS: dict[str, Any] = {
    "batch": "per_prompt",
    "attention": "sdpa",
    "threads": None,  # None: the free cores (`engines.threads.choose`)
    "num_assistant_tokens_schedule": "constant",
    "assistant_confidence_threshold": 0.0,
    "generate_args": {},
}


def parse_options(table: dict[str, Any], fail: Callable[[str, str], ConfigError]) -> dict[str, Any]:
    """Validated hf options (every key of `DEFAULTS`, defaults filled in) from a `[paths.NAME]` table."""
    opts = dict(DEFAULTS)
    for key, allowed in (("batch", BATCH_MODES), ("attention", ATTENTIONS),
                         ("num_assistant_tokens_schedule", SCHEDULES)):
        if key in table:
            if table[key] not in allowed:
                raise fail(key, f"must be one of {', '.join(allowed)} (got {table[key]!r})")
            opts[key] = table[key]
    if "threads" in table:
        threads = table["threads"]
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise fail("threads", f"must be a positive integer (got {threads!r})")
        opts["threads"] = threads
    if "assistant_confidence_threshold" in table:
        value = table["assistant_confidence_threshold"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise fail("assistant_confidence_threshold", f"must be a number in [0, 1) (got {value!r})")
        opts["assistant_confidence_threshold"] = float(value)
    if "generate_args" in table:
        args = table["generate_args"]
        if not isinstance(args, dict):
            raise fail("generate_args", "must be a table of generate() keyword arguments")
        clash = sorted(set(args) & RESERVED_GENERATE_ARGS)
        if clash:
            raise fail(f"generate_args.{clash[0]}", "is decided by the path itself; use the path's keys instead")
        opts["generate_args"] = dict(args)
        for key in ("top_k", "top_p"):
            if key in args and key in table:
                raise fail(f"generate_args.{key}", f"is given twice: the path's {key} is passed to generate() already")
        warpers = sorted(set(args) & OTHER_WARPERS)
        if warpers and opts["batch"] == "padded" and table.get("temperature", 0) > 0:
            raise fail(f"generate_args.{warpers[0]}", "cannot be used by a sampled padded path: its rows are drawn "
                                                       "by toolaudit's per-row seeded draw, which applies temperature, "
                                                       "top_k and top_p only (use batch = \"per_prompt\")")

    spec = table.get("speculative")
    method = spec.get("method") if isinstance(spec, dict) else None
    if isinstance(spec, dict):
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
        if opts["batch"] == "padded":
            raise fail("batch", "'padded' cannot be used with speculative: transformers' assisted generation "
                                "runs one prompt at a time (use batch = \"per_prompt\")")
    for key in ("num_assistant_tokens_schedule", "assistant_confidence_threshold"):
        if key in table and method != "draft_model":
            raise fail(key, "is only used with speculative method draft_model")
    return opts


def options_of(path_options: dict[str, Any]) -> dict[str, Any]:
    """The options of a `PathConfig` built in code (possibly empty or partial), defaults filled in."""
    return {**DEFAULTS, **{k: v for k, v in path_options.items() if k in DEFAULTS}}


def check_path(path) -> None:
    """What `parse_options` checks across keys, for a `PathConfig` built in code (`dataclasses.replace`)."""
    opts, spec = options_of(path.options), path.speculative

    def fail(key: str, message: str) -> ConfigError:
        return ConfigError(f"paths.{path.name}: {key} {message}")

    table: dict[str, Any] = {k: v for k, v in opts.items() if v != DEFAULTS[k]}  # what the path sets
    table.update({k: v for k, v, default in (("temperature", path.temperature, 0.0), ("top_k", path.top_k, 0),
                                             ("top_p", path.top_p, 1.0)) if v != default})
    if spec is not None:
        table["speculative"] = {"method": spec.method, "model": spec.model,
                                "prompt_lookup_min": spec.prompt_lookup_min}
    parse_options(table, fail)


CAPABILITIES = Capabilities(sees_logits=True, decodes_tokens=True, holds_together=True, in_process=True)
ENGINE = EngineSpec(name="hf", factory="toolaudit.engines.hf.engine:HFEngine", keys=KEYS,
                    parse_options=parse_options, capabilities=CAPABILITIES)
