"""The trace formats toolaudit knows: every entry point of the group `toolaudit.formats`, the built-in ones
(declared in toolaudit's own pyproject.toml) exactly as a third-party distribution's (docs/plugins.md).

Each entry point names a `TraceFormat`; its name is the entry point's name. The built-in formats come first, in
a fixed order, then plug-ins by name: that order is the one `--format` lists and detection asks in. A plug-in
that fails to load, is not a `TraceFormat`, or takes a name already taken stops the command with an error that
names its distribution and entry point: a format silently missing would read files as something else.

Detection reads a file's first records (`detect_format`): the first format whose rule says yes wins; a rule that
says "could be" (an OTLP export with no GenAI attribute yet) lets later records decide among the formats that
said so. A file no rule claims is read as an OpenAI log, whose parser explains what is wrong with each line.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from toolaudit import ConfigError
from toolaudit.ingest.formats.base import load_line
from toolaudit.ingest.formats.contract import Sample, TraceFormat
from toolaudit.ingest.formats.otlp_docs import first_document, is_pretty
from toolaudit.ingest.formats.spread import first_element, starts_array

GROUP = "toolaudit.formats"
BUILTIN = {"openai": "toolaudit.ingest.formats.openai", "otel": "toolaudit.ingest.formats.otel",
           "openinference": "toolaudit.ingest.formats.openinference", "langfuse": "toolaudit.ingest.formats.langfuse",
           "responses": "toolaudit.ingest.formats.responses", "phoenix": "toolaudit.ingest.formats.phoenix"}
FALLBACK = "openai"
_MAX_LINES = 1000
_MAX_BYTES = 64 << 20


class FormatPluginError(ConfigError):
    """A trace format plug-in that cannot be used (does not load, clashes, is not a TraceFormat)."""


@dataclass(frozen=True)
class Registered:
    format: TraceFormat
    origin: str  # "distribution toolaudit-csv-format 0.1.0 (entry point csv = toolaudit_csv_format:FORMAT)"


def _origin(ep: EntryPoint) -> str:
    dist = ep.dist
    who = f"distribution {dist.name} {dist.version}" if dist is not None else "an unknown distribution"
    return f"{who} (entry point {ep.name} = {ep.value})"


def _load_one(ep: EntryPoint) -> Registered:
    origin = _origin(ep)
    try:
        obj = ep.load()
    except Exception as exc:  # a plug-in's import may raise anything: name the plug-in, keep the cause
        raise FormatPluginError(f"trace format plug-in {ep.name!r} from {origin} failed to load: "
                                f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(obj, TraceFormat):
        raise FormatPluginError(f"trace format plug-in {ep.name!r} from {origin} is a {type(obj).__name__}, "
                                "not a toolaudit.ingest.formats.TraceFormat")
    if obj.name != ep.name:
        raise FormatPluginError(f"trace format plug-in {ep.name!r} from {origin} calls itself {obj.name!r}: the "
                                "entry point's name and the format's must be the same")
    return Registered(obj, origin)


@functools.lru_cache(maxsize=1)
def registered() -> dict[str, Registered]:
    """Every format by name, built-in ones first. Raises FormatPluginError for a plug-in that cannot be used."""
    found: dict[str, Registered] = {}
    for ep in entry_points(group=GROUP):
        one = _load_one(ep)
        if ep.name in found:
            raise FormatPluginError(f"trace format {ep.name!r} is registered twice: by {found[ep.name].origin} and "
                                    f"by {one.origin}; uninstall one of them")
        found[ep.name] = one
    for name, module in BUILTIN.items():  # a checkout run without being installed has no entry points
        if name not in found:
            found[name] = Registered(importlib.import_module(module).FORMAT, f"module {module}")
    order = [n for n in BUILTIN] + sorted(n for n in found if n not in BUILTIN)
    return {name: found[name] for name in order}


def reset() -> None:
    """Forget the loaded formats (after installing or removing a plug-in in the same process)."""
    registered.cache_clear()


def names() -> list[str]:
    return list(registered())


def get(name: str) -> TraceFormat:
    """The format called `name`; KeyError when there is none."""
    return registered()[name].format


def _ask(reg: Registered, sample: Sample, where: str) -> bool | None:
    try:
        return reg.format.detect(sample)
    except Exception as exc:  # a plug-in's rule must not turn into a traceback on someone else's file
        raise FormatPluginError(f"the detection rule of trace format {reg.format.name!r} from {reg.origin} "
                                f"failed on {where}: {type(exc).__name__}: {exc}") from exc


def sample(raw: bytes) -> Sample:
    value, error = load_line(raw)
    return Sample(raw, value, error is None)


def detect_format(path: str) -> tuple[str, int | None]:
    """(format, line that decided it); (FALLBACK, None) when no record decides."""
    formats = list(registered().values())
    pending: tuple[str, int, set[str]] | None = None  # (first "could be" format, its line, all that said so)
    seen_bytes = seen_lines = 0
    # one JSON array of records (`json.dump(records, f)`): its first element decides; one JSON document over many
    # lines (`json.dump(..., indent=2)`): its value decides
    document = first_element(path, _MAX_BYTES) if starts_array(path) else None
    if document is None and is_pretty(path):
        document = first_document(path, _MAX_BYTES)
    if document is not None:
        one = Sample(b"", document, True)
        verdicts = [(reg.format.name, _ask(reg, one, f"{path}:1")) for reg in formats]
        for wanted in (True, None):
            for name, verdict in verdicts:
                if verdict is wanted:
                    return name, 1
    with open(path, "rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            seen_bytes += len(raw)
            if not raw.strip():
                continue
            seen_lines += 1
            if seen_lines > _MAX_LINES or seen_bytes > _MAX_BYTES:
                break
            one = sample(raw)
            verdicts = [(reg.format.name, _ask(reg, one, f"{path}:{line_no}")) for reg in formats]
            yes = [name for name, verdict in verdicts if verdict is True]
            if pending is None:
                maybe = [name for name, verdict in verdicts if verdict is None]
                if yes:
                    return yes[0], line_no
                if maybe:
                    pending = (maybe[0], line_no, set(maybe))
                elif one.is_json and isinstance(one.value, dict):
                    return FALLBACK, None
                continue
            decided = [name for name in yes if name in pending[2]]
            if decided:
                return decided[0], line_no
            if yes:
                break  # a record of another format after the undecided one does not change what the file is
    if pending is not None:
        return pending[0], pending[1]
    return FALLBACK, None


def describe(record: Any) -> str | None:
    """The format one parsed record looks like (the first that says yes, else the first that says "could be")."""
    one = Sample(b"", record, True)
    maybe = None
    for reg in registered().values():
        verdict = _ask(reg, one, "a record")
        if verdict is True:
            return reg.format.name
        if verdict is None and maybe is None:
            maybe = reg.format.name
    return maybe


def mixed(record: Any, expected: str) -> str:
    """" (this line looks like <another format>: one format per file)" when it does, else ""."""
    other = describe(record)
    if other is None or other == expected:
        return ""
    return f" (this line looks like {get(other).a_record}, but the file is read as {expected}: one format per file)"
