"""Which engines exist: every `EngineSpec` registered under the `toolaudit.engines` entry-point group.

The built-in engines register the same way a plug-in does (toolaudit's own pyproject.toml names
`toolaudit.engines.<name>.config:ENGINE`), so a distribution that serves SGLang, TGI or TensorRT-LLM in process
adds an engine by declaring an entry point, without editing toolaudit (see docs/plugins.md). An `EngineSpec`
is light (no torch, openai or vLLM import): `paths.toml` is read and checked on a machine that has none of
them; the engine class behind `factory` is imported when a path first needs an engine.

Discovery is lazy and forgiving: a plug-in that fails to load, or two distributions registering one name, make
that name unusable with a `ConfigError` naming the distribution and entry point, while paths on other
engines keep working. This module imports no engine package and not `.paths` (which imports it).
"""

from __future__ import annotations

import importlib.metadata
import pkgutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from toolaudit import ConfigError

from .base import Capabilities, Engine
from .logs import LogNote
from .options import keys_of, parse, read, stored

GROUP = "toolaudit.engines"
# The built-ins' entry points as pyproject.toml declares them (a test keeps the two equal): used only when
# toolaudit runs from a source tree that was never installed, which has no entry-point metadata.
BUILTIN = {name: f"toolaudit.engines.{name}.config:ENGINE" for name in ("hf", "openai", "torch", "vllm")}

Fail = Callable[[str, str], ConfigError]


@dataclass(frozen=True)
class EngineSpec:
    """What toolaudit knows of an engine before importing it. A distribution exposes one per engine as the
    object its `toolaudit.engines` entry point names (the entry point's name is the engine's name). `path`
    arguments below are `paths.PathConfig`s (not imported here: `paths` imports this module).

    `factory` is "module:attribute" of a callable `factory(path) -> Engine`, usually the `Engine` subclass
    itself, imported on first use. `options` is a frozen dataclass of the engine's own `[paths.NAME]` keys
    besides the common ones (`paths.COMMON_KEYS`), each declared with `options.key(...)`: its type, default and
    allowed values. The registry validates a table against it (one message format for every engine) and
    `check(options, table, fail)` adds the rules across keys (and any common key whose allowed values differ for
    this engine), raising `fail(key, message)`. `PathConfig.options` holds the keys as a dict (every key with
    `store_defaults`, else those the table set); engines read them typed with `read(path.options)`.
    `stored_options(options)` is those options as a run may store them (`PathConfig.config_dict`): an engine
    whose keys can hold secrets (auth headers) replaces them there; None stores them as they are.

    An engine without a dataclass may still give `keys` and a hand-written `parse_options(table, fail)`.
    """

    name: str
    factory: str
    keys: frozenset[str] = frozenset()  # derived from `options` when that is given
    parse_options: Callable[[dict[str, Any], Fail], dict[str, Any]] | None = None  # derived from `options`
    capabilities: Capabilities = Capabilities()
    stored_options: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    notes: tuple[LogNote, ...] = ()  # lines of the engine's own log to repeat to the user (see `logs`)
    source: str = ""  # set by the registry: "the distribution D (entry point N = V in group toolaudit.engines)"
    options: type | None = None  # a frozen dataclass of the engine's keys (`engines.options`)
    check: Callable[[Any, Mapping[str, Any], Fail], None] | None = None  # rules across keys
    store_defaults: bool = True

    def __post_init__(self) -> None:
        if self.options is None:
            if self.parse_options is None:
                raise TypeError(f"EngineSpec {self.name!r}: give options (a dataclass of its keys) or parse_options")
            return
        if not self.keys:
            object.__setattr__(self, "keys", keys_of(self.options))
        if self.parse_options is None:
            object.__setattr__(self, "parse_options", self._parse_typed)

    def _parse_typed(self, table: Mapping[str, Any], fail: Fail) -> dict[str, Any]:
        return stored(self.typed(table, fail), table, self.store_defaults)

    def typed(self, table: Mapping[str, Any], fail: Fail) -> Any:
        """The table's keys checked against `options` (types, allowed values), then `check`'s rules, typed."""
        typed = parse(self.options, table, fail)
        if self.check is not None:
            self.check(typed, table, fail)
        return typed

    def read(self, path_options: Mapping[str, Any]) -> Any:
        """A path's options as the engine's dataclass (defaults where the dict leaves keys out)."""
        if self.options is None:
            raise TypeError(f"engine {self.name!r} declares no options dataclass")
        return read(self.options, path_options)

    def load_factory(self) -> Callable[..., Engine]:
        """The factory, imported now (an `ImportError` names what the engine needs)."""
        return pkgutil.resolve_name(self.factory)

    def create(self, path) -> Engine:
        """An engine for `path` (nothing loads yet). Missing dependencies and a factory that returns something
        other than an `Engine` are `ConfigError`s naming the path and who registered the engine."""
        try:
            factory = self.load_factory()
        except ImportError as exc:
            raise ConfigError(f"paths.{path.name}: the {self.name} engine cannot be imported ({exc}); "
                              f"registered by {self.source or self.factory}") from None
        engine = factory(path)
        if not isinstance(engine, Engine):
            raise ConfigError(f"paths.{path.name}: the {self.name} engine's factory {self.factory} returned a "
                              f"{type(engine).__name__}, not a toolaudit.engines.Engine ({self.source})")
        return engine

    def with_override(self, path, key: str, value: Any):
        """`path` with a run-wide override of one of this engine's `capabilities.overrides` keys, validated by
        `parse_options` as if paths.toml set it (the path's dtype and device alongside, for cross-key rules)."""
        def fail(k: str, message: str) -> ConfigError:
            return ConfigError(f"paths.{path.name}: {k} {message} (a run-wide override)")

        parsed = self.parse_options({"dtype": path.dtype, "device": path.device, key: value}, fail)
        return replace(path, options={**path.options, key: parsed[key]})


class Registry(Mapping[str, EngineSpec]):
    """name -> `EngineSpec` of every engine that loaded; names that did not are in `problems`. Discovered on
    first use from `entry_points` (default: the installed `toolaudit.engines` group)."""

    def __init__(self, entry_points: Callable[[], list[importlib.metadata.EntryPoint]] | None = None):
        self._entry_points = entry_points or _installed
        self._specs: dict[str, EngineSpec] | None = None
        self._problems: dict[str, str] = {}

    def reload(self) -> None:
        """Forget what was discovered (e.g. after installing a plug-in in this process)."""
        self._specs, self._problems = None, {}

    @property
    def specs(self) -> dict[str, EngineSpec]:
        if self._specs is None:
            self._specs, self._problems = _discover(self._entry_points())
        return self._specs

    @property
    def problems(self) -> dict[str, str]:
        """name -> why that engine cannot be used (failed to load, or registered twice)."""
        self.specs  # noqa: B018 (discover)
        return self._problems

    def __getitem__(self, name: str) -> EngineSpec:
        return self.specs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self.specs))

    def __len__(self) -> int:
        return len(self.specs)

    def problem(self, name: str) -> str | None:
        """Why `name` cannot be used, as words that follow "engine 'NAME'"; None when it can."""
        if name in self.problems:
            return self.problems[name]
        if name not in self.specs:
            return f"is not available (available: {', '.join(self) or 'none'})"
        return None

    def spec(self, name: str, where: str) -> EngineSpec:
        """The spec of `name`, or a `ConfigError` that starts with `where` (e.g. "paths.x")."""
        why = self.problem(name)
        if why is not None:
            raise ConfigError(f"{where}: engine {name!r} {why}")
        return self.specs[name]


def _installed() -> list[importlib.metadata.EntryPoint]:
    found = list(importlib.metadata.entry_points(group=GROUP))
    if not any(ep.dist is not None and ep.dist.name == "toolaudit" for ep in found):
        found += [importlib.metadata.EntryPoint(name, value, GROUP) for name, value in BUILTIN.items()]
    return found


def _discover(entry_points: list[importlib.metadata.EntryPoint]) -> tuple[dict[str, EngineSpec], dict[str, str]]:
    """Load every entry point; a failure or a clash is recorded against its name, never raised."""
    by_name: dict[str, list[importlib.metadata.EntryPoint]] = {}
    for ep in entry_points:
        same = by_name.setdefault(ep.name, [])
        if all((_dist(e), e.value) != (_dist(ep), ep.value) for e in same):  # one distribution seen twice
            same.append(ep)
    specs: dict[str, EngineSpec] = {}
    problems: dict[str, str] = {}
    for name, eps in by_name.items():
        if len(eps) > 1:
            who = " and ".join(_origin(ep) for ep in eps)
            problems[name] = f"is registered twice, by {who}: uninstall one of them"
            continue
        ep = eps[0]
        try:
            spec = ep.load()
        except Exception as exc:  # noqa: BLE001 -- a broken plug-in must not break the other engines
            problems[name] = f"comes from {_origin(ep)}, which failed to load: {type(exc).__name__}: {exc}"
            continue
        if not isinstance(spec, EngineSpec):
            problems[name] = (f"comes from {_origin(ep)}, which is a {type(spec).__name__}, "
                              "not a toolaudit.engines.EngineSpec")
        elif spec.name != name:
            problems[name] = f"comes from {_origin(ep)}, whose EngineSpec is named {spec.name!r}"
        else:
            specs[name] = replace(spec, source=_origin(ep))
    return specs, problems


def _dist(ep: importlib.metadata.EntryPoint) -> str:
    return ep.dist.name if ep.dist is not None else "toolaudit"


def _origin(ep: importlib.metadata.EntryPoint) -> str:
    return f"the distribution {_dist(ep)} (entry point {ep.name} = {ep.value} in group {GROUP})"


ENGINES = Registry()
