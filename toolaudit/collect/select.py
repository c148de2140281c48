"""Reading collected traffic back: a time window and a deterministic sample of whole sessions, written as one
OTLP/JSON file that `replay` and `compare` then read like any export (format detection, sessions, customers and
call order all come from the readers, `ingest/traces.py`; nothing here parses a span into a call).

Three passes over the collected files, so memory holds ids, not spans:
1. the window (`since`): the traces with a span that started in it (hourly files wholly older are not opened;
   a file's hour is its receive time, which is never before a span's start);
2. those traces (of one `service.name` when asked) written to a staging file, and read by the readers: each
   call's span id, session and customer;
3. the sample: per customer or overall, the `sample` sessions with the smallest keyed blake2b hash of their id
   (stable across runs and machines, `seed` changes the draw); their traces are written out, less the call
   spans of sessions not drawn, so a trace's context spans (a parent carrying the session) stay with its calls.
The GenAI log records of the spans written (a call's content, in the official OpenAI instrumentation's event
mode) follow them as `resourceLogs` lines, which the `otel` reader joins to their spans.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import orjson

from toolaudit import ConfigError, TraceError
from toolaudit.collect.files import collected_files, complete_lines, file_hour
from toolaudit.ingest.traces import DEFAULT_CUSTOMER_KEY, DEFAULT_SESSION_KEY, TraceCall, read_trace

SPANS, LOGS = "resourceSpans", "resourceLogs"
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
NO_CUSTOMER = "(none)"


def parse_duration(text: str) -> float:
    """`90s`, `30m`, `24h`, `7d`, `2w` as seconds."""
    match = _DURATION.fullmatch(text)
    if not match:
        raise ConfigError(f"--since {text!r}: give a number and a unit, e.g. 24h, 30m, 7d (units s, m, h, d, w)")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


@dataclass(frozen=True)
class Selection:
    """What to take from the collected files."""

    since: str | None = None  # only traces with a span started this long ago or later (`parse_duration`)
    sample: int | None = None  # sessions to draw (per customer with per_customer); None: every session
    per_customer: bool = False
    seed: str = ""
    service: str | None = None  # only spans of resources with this `service.name`
    sessions: frozenset[str] | None = None  # only these sessions (the draw of the other side of a compare)
    session_key: str = DEFAULT_SESSION_KEY
    customer_key: str = DEFAULT_CUSTOMER_KEY
    trace_format: str | None = None


@dataclass
class Selected:
    """The written selection and what it holds."""

    path: Path
    files: int  # collected files read
    calls: int
    sessions: set[str] = field(default_factory=set)
    customers: set[str] = field(default_factory=set)

    def line(self, folder: str | Path) -> str:
        return (f"selected {self.calls} calls in {len(self.sessions)} sessions of {len(self.customers)} "
                f"customers from {self.files} files of {folder} -> {self.path}")


def select_collected(folder: str | Path, out: str | Path, selection: Selection, now_s: float | None = None
                     ) -> Selected:
    """Write the selection from `folder` to `out` (one OTLP/JSON request per line); ConfigError when the
    window holds no usable model call."""
    folder, out = Path(folder), Path(out)
    since_s = None if selection.since is None else parse_duration(selection.since)
    cutoff = None if since_s is None else int(((now_s or time.time()) - since_s) * 1e9)
    files = window_files(folder, cutoff)
    where = (f"{folder}" + (f" (service.name {selection.service!r})" if selection.service is not None else "")
             + (f" in the last {selection.since.strip()}" if selection.since is not None else ""))
    if not files:
        raise ConfigError(f"no collected files in {where}")
    in_window = _traces_in_window(files, cutoff, selection.service) if cutoff is not None else None
    out.parent.mkdir(parents=True, exist_ok=True)
    staged = out.with_name(out.name + ".staged")
    try:
        _write(files, staged, lambda service, span: (
            _service_matches(service, selection.service) and (in_window is None or span.get("traceId") in in_window)))
        calls = _calls(staged, selection, where)
        sessions = _draw(calls, selection)
        chosen_calls = {span_id: s for span_id, (s, _) in calls.items() if s in sessions}
        if not chosen_calls:
            raise ConfigError(f"none of the {len(selection.sessions or ())} sessions drawn on the other side has "
                              f"a call in {where}")
        if len(chosen_calls) == len(calls):
            os.replace(staged, out)
        else:
            traces = {span["traceId"] for _, span in _spans(_requests([staged])) if span.get("spanId") in chosen_calls}
            chosen = out.with_name(out.name + ".chosen")  # renamed whole: a kill never leaves half a selection
            _write([staged], chosen, lambda _, span: span.get("traceId") in traces and (
                span.get("spanId") not in calls or span.get("spanId") in chosen_calls))
            os.replace(chosen, out)
    finally:
        staged.unlink(missing_ok=True)
        out.with_name(out.name + ".chosen").unlink(missing_ok=True)
    customers = {calls[span_id][1] for span_id in chosen_calls}
    return Selected(out, len(files), len(chosen_calls), set(sessions), customers)


def selection_path(db: str | Path, label: str) -> Path:
    """Where a command's selection goes: beside its database, `DB.selections/<UTC time>-<label>.jsonl`, never
    over an earlier one (a run stores the path of what it read)."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = Path(f"{db}.selections") / f"{stamp}-{label}.jsonl"
    k = 2
    while out.exists():
        out, k = out.with_name(f"{stamp}-{label}-{k}.jsonl"), k + 1
    return out


def window_files(folder: Path, cutoff_ns: int | None) -> list[Path]:
    """The collected files that can hold spans started at or after the cutoff (all without one)."""
    files = collected_files(folder)
    if cutoff_ns is None:
        return files
    return [p for p in files if (file_hour(p) + timedelta(hours=1)).timestamp() * 1e9 > cutoff_ns]


def _documents(files: list[Path]) -> Iterator[dict]:
    """The export requests (of spans or of log records) of the files (complete lines only; a line that is no
    request is passed over: the receiver writes none, the readers would say what is wrong with it in a file they
    were given)."""
    for path in files:
        for _, line in complete_lines(path):
            try:
                doc = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(doc, dict) and (isinstance(doc.get(SPANS), list) or isinstance(doc.get(LOGS), list)):
                yield doc


def _requests(files: list[Path]) -> Iterator[dict]:
    """The span export requests of the files."""
    return (doc for doc in _documents(files) if isinstance(doc.get(SPANS), list))


def _spans(requests: Iterator[dict]) -> Iterator[tuple[str | None, dict]]:
    """(service.name of its resource, span) of every span."""
    for doc in requests:
        for rs in doc[SPANS]:
            service = _service_name(rs)
            for scope in rs.get("scopeSpans") or []:
                for span in scope.get("spans") or []:
                    if isinstance(span, dict):
                        yield service, span


def _service_name(rs: dict) -> str | None:
    for attr in (rs.get("resource") or {}).get("attributes") or []:
        if isinstance(attr, dict) and attr.get("key") == "service.name":
            value = (attr.get("value") or {}).get("stringValue")
            return value if isinstance(value, str) else None
    return None


def _service_matches(service: str | None, wanted: str | None) -> bool:
    return wanted is None or service == wanted


def _traces_in_window(files: list[Path], cutoff_ns: int, service: str | None) -> set[str]:
    """Trace ids with a span (of `service`) started at or after the cutoff, or with no readable start (the
    readers then say what is wrong with it)."""
    found = set()
    for name, span in _spans(_requests(files)):
        if _service_matches(name, service):
            start = _start_ns(span)
            if start is None or start >= cutoff_ns:
                found.add(span.get("traceId"))
    return found


def _start_ns(span: dict) -> int | None:
    raw = span.get("startTimeUnixNano")
    try:
        return int(raw)
    except (TypeError, ValueError):
        return None


def _write(files: list[Path], out: Path, keep: Callable[[str | None, dict], bool]) -> None:
    """The files' span requests with only the spans `keep(service, span)` accepts, one per line (emptied ones
    left out), then their log requests with only the records of those spans (the content the `otel` reader joins
    to them)."""
    kept: set[tuple[str, str]] = set()
    with out.open("wb") as handle:
        for doc in _requests(files):
            resources = []
            for rs in doc[SPANS]:
                service = _service_name(rs)
                scopes = []
                for scope in rs.get("scopeSpans") or []:
                    spans = [s for s in scope.get("spans") or [] if isinstance(s, dict) and keep(service, s)]
                    if spans:
                        scopes.append({**scope, "spans": spans})
                        kept.update((s.get("traceId"), s.get("spanId")) for s in spans)
                if scopes:
                    resources.append({**rs, "scopeSpans": scopes})
            if resources:
                handle.write(orjson.dumps({**doc, SPANS: resources}) + b"\n")
        for doc in _documents(files):
            resources = []
            for rl in doc.get(LOGS) if isinstance(doc.get(LOGS), list) else []:
                scopes = []
                for scope in (rl.get("scopeLogs") or []) if isinstance(rl, dict) else []:
                    records = [r for r in scope.get("logRecords") or []
                               if isinstance(r, dict) and (r.get("traceId"), r.get("spanId")) in kept]
                    if records:
                        scopes.append({**scope, "logRecords": records})
                if scopes:
                    resources.append({**rl, "scopeLogs": scopes})
            if resources:
                handle.write(orjson.dumps({LOGS: resources}) + b"\n")


def _calls(staged: Path, selection: Selection, where: str) -> dict[str, tuple[str, str]]:
    """{span id: (session, customer)} of every usable call, as the readers read them."""
    calls: dict[str, tuple[str, str]] = {}
    customers: dict[str, str] = {}  # a session's customer: its first call's
    try:
        for item in read_trace(staged, selection.session_key, selection.customer_key, require_response=False,
                               fmt=selection.trace_format):
            if isinstance(item, TraceCall) and item.record is not None:
                customer = customers.setdefault(item.session_id, item.customer or NO_CUSTOMER)
                calls[item.record] = (item.session_id, customer)
    except TraceError as exc:
        raise ConfigError(f"no usable model call collected in {where}: {exc}") from None
    return calls


def _draw(calls: dict[str, tuple[str, str]], selection: Selection) -> set[str]:
    """The sessions kept: `selection.sessions` if given, then the `sample` smallest hashes (per customer)."""
    by_session = {session: customer for session, customer in calls.values()}
    if selection.sessions is not None:
        by_session = {s: c for s, c in by_session.items() if s in selection.sessions}
    if selection.sample is None:
        return set(by_session)
    groups: dict[str, list[str]] = {}
    for session, customer in by_session.items():
        groups.setdefault(customer if selection.per_customer else "", []).append(session)
    key = hashlib.blake2b(selection.seed.encode(), digest_size=16).digest()

    def rank(session: str) -> bytes:
        return hashlib.blake2b(session.encode("utf-8", "surrogatepass"), key=key, digest_size=8).digest()

    return {s for members in groups.values() for s in sorted(members, key=rank)[: selection.sample]}

