"""Typed engine options (`toolaudit.engines.options`): a dataclass declares an engine's keys; the registry checks
a table against it with one message format and fills defaults; engines read fields."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from toolaudit import ConfigError
from toolaudit.engines import EngineSpec
from toolaudit.engines.options import defaults_of, key


@dataclass(frozen=True)
class Knobs:
    mode: str = key("fast", allowed=("fast", "exact"))
    rows: int | None = key(None, low=1)
    retries: int = key(3, low=0)
    share: float = key(0.9, low=0, low_open=True, high=1)
    top: int = key(2, low=0, high=20)
    verbose: bool = key(False)
    extra: dict = key({}, what="a table of extra arguments")


def fail(k: str, message: str) -> ConfigError:
    return ConfigError(f"paths.p: {k} {message}")


SPEC = EngineSpec(name="knobs", factory="x:y", options=Knobs)


@pytest.mark.parametrize("table, message", [
    ({"mode": "slow"}, "mode must be one of fast, exact (got 'slow')"),
    ({"rows": 0}, "rows must be a positive integer (got 0)"),
    ({"rows": True}, "rows must be a positive integer (got True)"),
    ({"retries": -1}, "retries must be an integer >= 0 (got -1)"),
    ({"share": 0}, "share must be a number in (0, 1] (got 0)"),
    ({"share": "a lot"}, "share must be a number in (0, 1] (got 'a lot')"),
    ({"top": 21}, "top must be an integer from 0 to 20 (got 21)"),
    ({"verbose": "yes"}, "verbose must be true or false (got 'yes')"),
    ({"extra": [1]}, "extra must be a table of extra arguments"),
])
def test_one_message_format_names_the_path_the_key_and_what_is_allowed(table, message):
    with pytest.raises(ConfigError) as err:
        SPEC.parse_options(table, fail)
    assert str(err.value) == f"paths.p: {message}"


def test_defaults_are_filled_and_engines_read_fields():
    stored = SPEC.parse_options({"rows": 4, "share": 1}, fail)
    assert stored == {**defaults_of(Knobs), "rows": 4, "share": 1.0}  # every key (store_defaults), typed
    typed = SPEC.read(stored)
    assert (typed.mode, typed.rows, typed.share, typed.extra) == ("fast", 4, 1.0, {})
    assert SPEC.keys == frozenset(defaults_of(Knobs))
    only_set = EngineSpec(name="k2", factory="x:y", options=Knobs, store_defaults=False)
    assert only_set.parse_options({"rows": 4}, fail) == {"rows": 4}  # what the table set, as it set it
    assert only_set.read({}).retries == 3


def test_check_adds_the_rules_across_keys_and_a_spec_needs_options_or_a_parser():
    def check(opts, table, fail):
        if opts.mode == "exact" and table.get("dtype") == "bfloat16":
            raise fail("mode", "'exact' needs float32")

    spec = EngineSpec(name="k3", factory="x:y", options=Knobs, check=check)
    with pytest.raises(ConfigError, match=r"paths.p: mode 'exact' needs float32"):
        spec.parse_options({"mode": "exact", "dtype": "bfloat16"}, fail)
    with pytest.raises(TypeError, match="give options"):
        EngineSpec(name="k4", factory="x:y")


def test_every_built_in_engine_declares_its_keys_typed():
    from toolaudit.engines.registry import Registry

    registry = Registry()
    for name in ("torch", "hf", "vllm", "openai"):
        spec = registry[name]
        assert spec.options is not None and spec.keys == frozenset(defaults_of(spec.options)), name
