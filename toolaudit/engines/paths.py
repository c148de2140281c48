"""Decode paths: named, validated configurations read from `paths.toml`.

A decode path is everything that decides how a completion is produced: engine, model, dtype, device, batch
size, sampling, speculative decoding and prompt rendering. Keys mirror vLLM's names (`speculative` matches its
`speculative_config`) so a path can be handed to another engine unchanged. Two built-in paths, `target` and
`spec-ngram`, differ only in speculative decoding; a `paths.toml` adds paths or replaces built-ins by name.

Only the keys every engine shares are validated here. The path's engine (looked up in the registry,
`toolaudit.engines.ENGINES`, built-ins and plug-ins alike) declares and validates its own keys, which land in
`PathConfig.options`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from toolaudit import ConfigError

from .registry import ENGINES

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

DTYPES = ("float32", "bfloat16", "float16", "float64")
DEFAULT_MODEL = "smollm2-135m"
DEFAULT_PREFILL = "<tool_call>\n"
MAX_FEW_SHOT = 2

COMMON_KEYS = frozenset({
    "engine", "model", "dtype", "device", "batch_size", "max_tokens", "temperature", "seed", "stop",
    "speculative", "prompt", "prefix_caching", "top_p", "top_k", "samples",
})
_SPEC_KEYS = {"method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "model"}
_PROMPT_KEYS = {"few_shot", "prefill"}


@dataclass(frozen=True)
class SpeculativeConfig:
    """vLLM-style `speculative_config`: who proposes tokens and how many per target verification pass."""

    method: str  # ngram | draft_model on the torch engine: each engine's config module checks the methods it runs
    num_speculative_tokens: int = 5
    prompt_lookup_min: int = 1  # ngram only: shortest suffix that may match
    prompt_lookup_max: int = 4  # ngram only: longest suffix tried first
    model: str | None = None  # a draft (or draft head) model spec, for the methods that take one


@dataclass(frozen=True)
class PromptConfig:
    """How requests are rendered. Part of the path so that a comparison can hold rendering fixed."""

    few_shot: int = MAX_FEW_SHOT  # made-up tool-call examples shown before the conversation (0..2)
    prefill: str = DEFAULT_PREFILL  # text the assistant turn starts with; "" for none


@dataclass(frozen=True)
class PathConfig:
    """One decode path. `options` holds the engine's own keys, as its config module validated them."""

    name: str
    engine: str = "torch"
    model: str = DEFAULT_MODEL
    dtype: str = "bfloat16"
    device: str = "cpu"
    batch_size: int = 16
    max_tokens: int = 96
    temperature: float = 0.0
    seed: int = 0
    top_p: float = 1.0  # nucleus sampling: the target's (and, inside rejection sampling, the draft's) kept mass
    top_k: int = 0  # keep the k most likely tokens when sampling; 0: all
    samples: int = 1  # decodes per call (temperature > 0): the outcome distribution a sampled replay compares
    stop: tuple[str, ...] | None = None  # None: `</tool_call>` when the prefill opens a tool call, else none
    prefix_caching: bool = True  # reuse prompt KV across calls and paths (vLLM's enable_prefix_caching)
    speculative: SpeculativeConfig | None = None
    prompt: PromptConfig = field(default_factory=PromptConfig)
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """The effective stop strings: explicit ones, or the close tag of a prefilled tool call."""
        if self.stop is not None:
            return self.stop
        return ("</tool_call>",) if self._opens_call else ()

    @property
    def value_end(self) -> bool:
        """Whether an answer also ends where the JSON value it opens with closes (`completion.ValueEnd`): by
        default when the prefill opens a tool call, whose JSON is then the answer (the close tag that follows
        carries no argument). Explicit `stop` strings keep only their own ends."""
        return self.stop is None and self._opens_call

    @property
    def _opens_call(self) -> bool:
        return self.prompt.prefill.lstrip().startswith("<tool_call>")

    def end_components(self) -> dict[str, Any]:
        """Where an answer ends, for fingerprints: the stop strings, and `value_end` where set (paths without it
        keep their earlier fingerprints; a run recorded before answers ended at the value is another path)."""
        return {"stop": list(self.stop_strings), **({"value_end": True} if self.value_end else {})}

    @property
    def sampled(self) -> bool:
        return self.temperature > 0

    def sampling_components(self) -> dict[str, Any]:
        """top_p, top_k and samples for a fingerprint, only where set: paths that never set them keep their
        earlier fingerprints."""
        out: dict[str, Any] = {}
        if self.top_p != 1.0:
            out["top_p"] = self.top_p
        if self.top_k:
            out["top_k"] = self.top_k
        if self.samples != 1:
            out["samples"] = self.samples
        return out

    def config_dict(self) -> dict[str, Any]:
        """Plain, JSON-ready values for fingerprints and the run record (name excluded: it is a label). Options
        are as the engine's `EngineSpec.stored_options` gives them: never a secret (e.g. an auth header's value)."""
        data = asdict(self)
        data.pop("name")
        data.update(self.end_components())
        spec = ENGINES.get(self.engine)
        if spec is not None and spec.stored_options is not None:
            data["options"] = spec.stored_options(data["options"])
        return data


def builtin_paths() -> dict[str, PathConfig]:
    """`target` (greedy, bf16) and `spec-ngram` (the same plus n-gram speculation, k=5): the default
    comparison. Remedies for a matrix (`toolaudit demo --matrix`): `spec-ngram-k3` (fewer speculative tokens),
    `spec-ngram-fp32` (speculation in float32), and `target-fp32`. `spec-draft`: draft-model speculation with
    the target's own first 8 layers as the draft (`smollm2-135m:first8`, k=3; docs/benchmarks.md measures it).
    `target-invariant` and `spec-ngram-invariant`: the same on batch-invariant kernels (`batch_invariant`), where
    batching noise is gone and speculation is exact in bf16 too (the remedy matrix offers the latter)."""
    target = PathConfig(name="target")
    spec = replace(
        target,
        name="spec-ngram",
        speculative=SpeculativeConfig(method="ngram", num_speculative_tokens=5, prompt_lookup_min=1,
                                      prompt_lookup_max=4),
    )
    k3 = replace(spec, name="spec-ngram-k3", speculative=replace(spec.speculative, num_speculative_tokens=3))
    fp32 = replace(spec, name="spec-ngram-fp32", dtype="float32")
    target32 = replace(target, name="target-fp32", dtype="float32")
    draft = replace(target, name="spec-draft", speculative=SpeculativeConfig(
        method="draft_model", num_speculative_tokens=3, model=f"{DEFAULT_MODEL}:first8"))
    invariant = {"batch_invariant": True}
    target_inv = replace(target, name="target-invariant", options=invariant)
    spec_inv = replace(spec, name="spec-ngram-invariant", options=invariant)
    return {p.name: p for p in (target, spec, k3, fp32, target32, draft, target_inv, spec_inv)}


def load_paths(file: Path | str | None = None) -> dict[str, PathConfig]:
    """The built-in paths, plus (and overridden by) the `[paths.NAME]` tables of `file` when given."""
    paths = builtin_paths()
    if file is None:
        return paths
    file = Path(file)
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{file}: file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    unknown = set(data) - {"paths"}
    if unknown:
        raise ConfigError(f"{file}: unknown top-level table(s) {', '.join(sorted(unknown))}; expected [paths.NAME]")
    tables = data.get("paths", {})
    if not isinstance(tables, dict):
        raise ConfigError(f"{file}: paths must be a table of [paths.NAME] tables")
    for name, table in tables.items():
        paths[name] = parse_path(name, table, source=str(file))
    return paths


def parse_path(name: str, table: Any, source: str | None = None) -> PathConfig:
    """Validate one `[paths.NAME]` table. Errors name the file (`source`, when the table came from one), the path
    and the key."""
    where = f"{source}: paths.{name}" if source else f"paths.{name}"

    def fail(key: str, message: str) -> ConfigError:
        return ConfigError(f"{where}: {key} {message}")

    if not isinstance(table, dict):
        raise ConfigError(f"{where}: must be a table")
    engine = _get(table, "engine", str, "torch", fail)
    if engine in ENGINES.problems:  # a plug-in that failed to load, or a name registered twice
        raise fail("engine", f"{engine!r} {ENGINES.problems[engine]}")
    if engine not in ENGINES:
        raise fail("engine", f"must be one of {', '.join(ENGINES)} (got {engine!r})")
    engine_spec = ENGINES[engine]
    known = COMMON_KEYS | engine_spec.keys
    unknown = sorted(set(table) - known)
    if unknown:
        raise fail(unknown[0], f"is not a key the {engine} engine knows ({', '.join(sorted(known))})")

    dtype = _get(table, "dtype", str, "bfloat16", fail)
    if dtype not in DTYPES:
        raise fail("dtype", f"must be one of {', '.join(DTYPES)} (got {dtype!r})")
    device = _get(table, "device", str, "cpu", fail)
    if not (device == "cpu" or device == "cuda" or device.startswith("cuda:")):
        raise fail("device", f"must be cpu, cuda or cuda:N (got {device!r})")
    batch_size = _positive_int(table, "batch_size", 16, fail)
    max_tokens = _positive_int(table, "max_tokens", 96, fail)
    temperature = float(_get(table, "temperature", (int, float), 0.0, fail))
    if temperature < 0:
        raise fail("temperature", "must be >= 0")
    seed = _get(table, "seed", int, 0, fail)
    top_p = float(_get(table, "top_p", (int, float), 1.0, fail))
    if not 0 < top_p <= 1:
        raise fail("top_p", f"must be in (0, 1] (got {top_p})")
    top_k = _get(table, "top_k", int, 0, fail)
    if top_k < 0:
        raise fail("top_k", f"must be >= 0, 0 for all tokens (got {top_k})")
    samples = _positive_int(table, "samples", 1, fail)
    if samples > 1 and temperature == 0:
        raise fail("samples", "needs temperature > 0: greedy decoding gives the same answer every time")
    prefix_caching = _get(table, "prefix_caching", bool, True, fail)
    stop = table.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            raise fail("stop", "must be a string or a list of non-empty strings")
        stop = tuple(stop)

    return PathConfig(
        name=name, engine=engine, model=_get(table, "model", str, DEFAULT_MODEL, fail), dtype=dtype,
        device=device, batch_size=batch_size, max_tokens=max_tokens, temperature=temperature, seed=seed,
        top_p=top_p, top_k=top_k, samples=samples, stop=stop, prefix_caching=prefix_caching,
        speculative=_parse_speculative(table.get("speculative"), fail),
        prompt=_parse_prompt(table.get("prompt"), fail), options=engine_spec.parse_options(table, fail),
    )


def _parse_speculative(spec: Any, fail) -> SpeculativeConfig | None:
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise fail("speculative", "must be a table, e.g. {method = \"ngram\", num_speculative_tokens = 5}")
    unknown = set(spec) - _SPEC_KEYS
    if unknown:
        raise fail(f"speculative.{sorted(unknown)[0]}", f"is not a known key ({', '.join(sorted(_SPEC_KEYS))})")
    k = _positive_int(spec, "num_speculative_tokens", 5, fail, prefix="speculative.")
    lo = _positive_int(spec, "prompt_lookup_min", 1, fail, prefix="speculative.")
    hi = _positive_int(spec, "prompt_lookup_max", max(lo, 4), fail, prefix="speculative.")
    if lo > hi:
        raise fail("speculative.prompt_lookup_min", f"must be <= prompt_lookup_max ({lo} > {hi})")
    # `method` and `model` are checked by the engine's config module: engines run different methods.
    return SpeculativeConfig(method=spec.get("method"), num_speculative_tokens=k, prompt_lookup_min=lo,
                             prompt_lookup_max=hi, model=spec.get("model"))


def _parse_prompt(prompt: Any, fail) -> PromptConfig:
    if prompt is None:
        return PromptConfig()
    if not isinstance(prompt, dict):
        raise fail("prompt", "must be a table with few_shot and/or prefill")
    unknown = set(prompt) - _PROMPT_KEYS
    if unknown:
        raise fail(f"prompt.{sorted(unknown)[0]}", f"is not a known key ({', '.join(sorted(_PROMPT_KEYS))})")
    few_shot = prompt.get("few_shot", MAX_FEW_SHOT)
    if isinstance(few_shot, bool):
        few_shot = MAX_FEW_SHOT if few_shot else 0
    elif not isinstance(few_shot, int) or not 0 <= few_shot <= MAX_FEW_SHOT:
        raise fail("prompt.few_shot", f"must be true, false or a count from 0 to {MAX_FEW_SHOT}")
    prefill = prompt.get("prefill", DEFAULT_PREFILL)
    if not isinstance(prefill, str):
        raise fail("prompt.prefill", "must be a string (\"\" for none)")
    return PromptConfig(few_shot=few_shot, prefill=prefill)


def _get(table: dict, key: str, types, default, fail):
    value = table.get(key, default)
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise fail(key, f"must be {_type_name(types)}, not a boolean")
    if not isinstance(value, types):
        raise fail(key, f"must be {_type_name(types)} (got {value!r})")
    return value


def _positive_int(table: dict, key: str, default: int, fail, prefix: str = "") -> int:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise fail(prefix + key, f"must be a positive integer (got {value!r})")
    return value


def _type_name(types) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "a boolean"}
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join(dict.fromkeys(names.get(t, t.__name__) for t in types))
