"""OpenAI Batch interop: replay requests written as Batch input, their outputs read back as one side of a run.

`export_requests` writes one Batch input line per selected call (`custom_id`, `method`, `url`, `body`): the
recorded messages and tools plus the decode path's model, temperature, max_tokens and seed (an openai-engine
path adds its tool_choice, logprobs and extra_body keys). The server renders the chat template. `custom_id` is
the JSON array `[session_id, call_index, customer]`, so an import needs nothing but the two files.

`import_results` reads a Batch output file (`{custom_id, response: {status_code, body}, error}` per line) as
the `baseline` or `candidate` side of a `batch` run: every request is accounted for (an error, a non-200 status
or a missing result becomes an error row; a custom_id that is not in the requests file becomes a trace_errors
row). Results wait in `staged_results` until the other side's arrive; a call with both sides is diffed and
written like a replayed call. Importing again is idempotent: paired calls are kept, error rows are retried
(import a results file of the retried requests to fix them).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from toolaudit import ConfigError, OptionError, StoreError
from toolaudit.compare.pairs import Analyzer, write_call, write_output
from toolaudit.compare.request_digest import digest_hex
from toolaudit.engines import EngineResult
from toolaudit.engines.fingerprint import fingerprint
from toolaudit.engines.openai.engine import request_seed
from toolaudit.engines.openai.shapes import openai_messages, openai_tools, result_from_response
from toolaudit.engines.paths import PathConfig, load_paths
from toolaudit.ingest.traces import EXCERPT_CHARS
from toolaudit.replay.replayer import ReplayOptions, first_divergence, load_calls, side_output
from toolaudit.store import RowBuffer, Store
from toolaudit.store import batch as sb
from toolaudit.store.vocabulary import MatchStatus
from toolaudit.validate.schemas import SchemaRegistry

URL = "/v1/chat/completions"
SIDES = ("baseline", "candidate")
_PAIR_CHUNK = 5000  # calls written per transaction


def custom_id(session_id: str, call_index: int, customer: str | None) -> str:
    return orjson.dumps([session_id, call_index, customer]).decode()


def parse_custom_id(text: Any) -> tuple[str, int, str | None] | None:
    try:
        value = orjson.loads(text) if isinstance(text, str) else None
    except orjson.JSONDecodeError:
        return None
    if (isinstance(value, list) and len(value) == 3 and isinstance(value[0], str) and isinstance(value[1], int)
            and (value[2] is None or isinstance(value[2], str))):
        return value[0], value[1], value[2]
    return None


def resolve_path(name: str, paths_file: str | None) -> PathConfig:
    paths = load_paths(paths_file)
    if name not in paths:
        raise OptionError(f"unknown decode path {name!r} (known in {paths_file or 'the built-in paths'}: "
                          f"{', '.join(sorted(paths))})")
    return paths[name]


def request_body(path: PathConfig, messages: list, tools: list, model: str | None = None,
                 key: str = "") -> dict[str, Any]:
    """The Chat Completions body of one replayed call on `path` (as the openai engine would send it: the seed is
    the call's own, `request_seed`, so the calls of a sampled path do not all draw with one seed)."""
    body: dict[str, Any] = {"model": model or path.model, "messages": openai_messages(messages),
                            "temperature": path.temperature, "max_tokens": path.max_tokens,
                            "seed": request_seed(path.seed, key, 0) if path.temperature > 0 else path.seed}
    if tools:
        body["tools"] = openai_tools(tools)
    if path.stop is not None:
        body["stop"] = list(path.stop)
    if path.engine == "openai":
        opts = path.options
        if opts.get("tool_choice") is not None and tools:
            body["tool_choice"] = opts["tool_choice"]
        if opts.get("logprobs"):
            body["logprobs"] = True
            body["top_logprobs"] = opts.get("top_logprobs", 2)
        body.update(opts.get("extra_body") or {})
    return body


@dataclass
class ExportCounts:
    requests: int = 0
    bad_lines: int = 0  # trace lines that could not be used (not exported)
    traces: dict[str, dict] = field(default_factory=dict)


def export_requests(options: ReplayOptions, out: str | Path, model: str | None = None) -> ExportCounts:
    """Write the Batch input file of `options.baseline`'s path over the selected calls (limit, calls per
    session and shard apply as in `replay`)."""
    path = resolve_path(options.baseline, options.paths_file)
    calls, bad, stats = load_calls(options)
    counts = ExportCounts(bad_lines=len(bad), traces=stats)
    with open(out, "wb") as handle:
        for call in calls:
            line = {"custom_id": custom_id(call.session_id, call.call_index, call.customer), "method": "POST",
                    "url": URL, "body": request_body(path, call.request.get("messages") or [], call.tools, model,
                                                     f"{call.session_id}\x1f{call.call_index}")}
            handle.write(orjson.dumps(line) + b"\n")
            counts.requests += 1
    return counts


@dataclass
class ImportCounts:
    requests: int = 0
    results: int = 0
    result_errors: int = 0  # error or non-200 results
    missing: int = 0  # requests without a result
    unknown: int = 0  # result lines that match no request (trace_errors rows)
    already_paired: int = 0
    paired: int = 0  # calls written by this import (error rows included)
    error_rows: int = 0
    waiting: int = 0  # staged, the other side not imported yet


@dataclass
class _Request:
    line: int
    customer: str | None
    tools: list
    digest: str  # of the request body (compare.request_digest): the two sides' must agree to be compared


def _error_row(errors: RowBuffer, run_id: int, side: str, source: str, line: int, message: str, raw: bytes,
               field_name: str | None = None) -> None:
    errors.add("trace_errors", run_id=run_id, side=side, source=source, line=line, field=field_name,
               message=message, excerpt=raw[:EXCERPT_CHARS].decode("utf-8", "replace").rstrip())


def _json_lines(path: str, run_id: int, side: str, errors: RowBuffer) -> Iterator[tuple[int, bytes, Any]]:
    """(line number, raw line, parsed JSON) of each non-blank line; a line that is not JSON becomes an error row."""
    with open(path, "rb") as handle:
        for n, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                yield n, raw, orjson.loads(raw)
            except orjson.JSONDecodeError:
                _error_row(errors, run_id, side, path, n, "not valid JSON", raw)


def _read_requests(path: str, run_id: int, side: str, errors: RowBuffer) -> dict[tuple[str, int], _Request]:
    requests: dict[tuple[str, int], _Request] = {}
    for n, raw, line in _json_lines(path, run_id, side, errors):
        key = parse_custom_id(line.get("custom_id")) if isinstance(line, dict) else None
        body = line.get("body") if isinstance(line, dict) else None
        if key is None or not isinstance(body, dict):
            _error_row(errors, run_id, side, path, n, "not a toolaudit batch request (custom_id "
                       "[session, call_index, customer] and a body)", raw, "custom_id")
            continue
        if key[:2] in requests:
            _error_row(errors, run_id, side, path, n, f"duplicate custom_id (first at line "
                       f"{requests[key[:2]].line})", raw, "custom_id")
            continue
        tools = body.get("tools")
        requests[key[:2]] = _Request(n, key[2], tools if isinstance(tools, list) else [], digest_hex(body))
    return requests


def result_from_line(key: str, line: dict) -> EngineResult:
    """One Batch output line -> EngineResult (errors and non-200 statuses become error results)."""
    error, response = line.get("error"), line.get("response")
    if error:
        message = error.get("message") if isinstance(error, dict) else str(error)
        code = error.get("code") if isinstance(error, dict) else None
        return EngineResult(key=key, error=f"batch error{f' {code}' if code else ''}: {message}")
    if not isinstance(response, dict):
        return EngineResult(key=key, error="batch result without a response")
    status, body = response.get("status_code"), response.get("body")
    if status != 200:
        detail = body.get("error") if isinstance(body, dict) else body
        if isinstance(detail, dict):
            detail = detail.get("message", detail)
        return EngineResult(key=key, error=f"HTTP {status}: {detail}")
    if not isinstance(body, dict):
        return EngineResult(key=key, error="batch result body is not a JSON object")
    return result_from_response(key, body, 0.0, 0.0)


def _open_run(store: Store, run_id: int | None, run_name: str | None, side: str, path: PathConfig,
              requests_path: str, schema_dir: str | None) -> tuple[int, dict]:
    config_fp = fingerprint({"engine": path.engine, "config": path.config_dict()})
    if run_id is None:
        names = {s: (path.name if s == side else None) for s in SIDES}
        run_id = store.create_run("batch", run_name, names["baseline"], names["candidate"], "", "",
                                  {"schema_dir": schema_dir})
        run = store.run_row(run_id)
    else:
        run = store.run_row(run_id)
        if run["kind"] != "batch":
            raise StoreError(f"run {run_id} is a {run['kind']} run; batch import needs a batch run")
        if run[f"{side}_name"] not in (None, path.name):
            raise StoreError(f"run {run_id}: the {side} side is path {run[f'{side}_name']!r}, not {path.name!r}")
    options = orjson.loads(run["options"]) if run["options"] else {}
    options[f"{side}_config"] = path.config_dict()
    options[f"{side}_requests"] = requests_path
    sb.set_side(store, run_id, side, path.name, requests_path, config_fp, options)
    return run_id, options


def import_results(store: Store, requests_path: str, results_path: str, side: str, path_name: str,
                   paths_file: str | None = None, run_id: int | None = None, run_name: str | None = None,
                   schema_dir: str | None = None) -> tuple[int, ImportCounts]:
    """Store a Batch output file as `side` of a batch run (created when `run_id` is None)."""
    if side not in SIDES:
        raise ConfigError(f"side must be baseline or candidate (got {side!r})")
    path = resolve_path(path_name, paths_file)
    run_id, options = _open_run(store, run_id, run_name, side, path, str(requests_path), schema_dir)
    counts = ImportCounts()
    errors = RowBuffer()
    requests = _read_requests(str(requests_path), run_id, side, errors)
    counts.requests = len(requests)
    results: dict[tuple[str, int], tuple[int, EngineResult]] = {}
    for n, raw, line in _json_lines(str(results_path), run_id, side, errors):
        cid = line.get("custom_id") if isinstance(line, dict) else None
        key = parse_custom_id(cid)
        if key is None or key[:2] not in requests:
            counts.unknown += 1
            _error_row(errors, run_id, side, str(results_path), n,
                       f"custom_id {cid!r} is not a request of {requests_path}", raw, "custom_id")
            continue
        if key[:2] in results:
            counts.unknown += 1
            _error_row(errors, run_id, side, str(results_path), n, f"second result for custom_id {cid!r} "
                       f"(first at line {results[key[:2]][0]})", raw, "custom_id")
            continue
        counts.results += 1
        result = result_from_line(cid, line)
        counts.result_errors += result.error is not None
        results[key[:2]] = (n, result)
    done = sb.final_keys(store, run_id)
    staged = RowBuffer()
    todo = []
    for key, req in requests.items():
        if key in done:
            counts.already_paired += 1
            continue
        _, result = results.get(key) or (0, EngineResult(key=custom_id(*key, req.customer),
                                                         error=f"no result for this request in {results_path}"))
        counts.missing += key not in results
        todo.append(key)
        data = orjson.loads(orjson.dumps(result))
        data["request_line"] = req.line
        data["request_digest"] = req.digest
        staged.add("staged_results", run_id=run_id, session_id=key[0], call_index=key[1], side=side,
                   path_name=path.name, wall_share_s=None, result=orjson.dumps(data).decode())
    sb.stage(store, run_id, side, staged, errors)
    analyzer = Analyzer(run_id, SchemaRegistry(schema_dir if schema_dir is not None else options.get("schema_dir")))
    for start in range(0, len(todo), _PAIR_CHUNK):
        _pair(store, run_id, options, requests, todo[start:start + _PAIR_CHUNK], analyzer, counts)
    counts.waiting = len(todo) - counts.paired
    _finish(store, run_id, side, counts)
    return run_id, counts


def _result(text: str) -> tuple[EngineResult, int | None, str | None]:
    """A staged result, the line of its request and the request's digest (None: staged by an older toolaudit)."""
    data = orjson.loads(text)
    line = data.pop("request_line", None)
    digest = data.pop("request_digest", None)
    data["top2"] = [tuple(p) for p in data.get("top2") or ()]
    known = EngineResult.__dataclass_fields__
    return EngineResult(**{k: v for k, v in data.items() if k in known}), line, digest


def _pair(store: Store, run_id: int, options: dict, requests: dict[tuple[str, int], _Request],
          keys: list[tuple[str, int]], analyzer: Analyzer, counts: ImportCounts) -> None:
    rows = RowBuffer()
    written, unstage = [], []
    for session_id, call_index, b_path, b_text, c_path, c_text in sb.staged_pairs(store, run_id, keys):
        req = requests[(session_id, call_index)]
        (b_res, b_line, b_digest), (c_res, c_line, c_digest) = _result(b_text), _result(c_text)
        outs = []
        for side, res, name, line, digest in (("baseline", b_res, b_path, b_line, b_digest),
                                              ("candidate", c_res, c_path, c_line, c_digest)):
            out = side_output(res, PathConfig(name=name), 0.0, digest)
            out.source, out.line = options.get(f"{side}_requests"), line
            outs.append(out)
        written.append((session_id, call_index))
        if b_res.error or c_res.error:
            counts.error_rows += 1
            message = "; ".join(f"{s}: {r.error}" for s, r in (("baseline", b_res), ("candidate", c_res)) if r.error)
            write_call(rows, run_id, session_id, call_index, MatchStatus.ERROR, customer=req.customer,
                       detail=message)
            for side, out in zip(SIDES, outs):
                write_output(rows, run_id, session_id, call_index, side, out.row())
        else:
            unstage.append((session_id, call_index))
            # a Batch requests file holds no recorded response: `recorded_tool` stays NULL (figures fall back)
            analyzer.pair(rows, session_id, call_index, req.customer, req.tools, outs[0], outs[1],
                          first_divergence(b_res, c_res, None), recorded=None)
    analyzer.flush_issues(rows)
    counts.paired += len(written)
    sb.write_pairs(store, run_id, rows, written, unstage)


def _finish(store: Store, run_id: int, side: str, counts: ImportCounts) -> None:
    run = store.run_row(run_id)
    previous = orjson.loads(run["counts"]) if run["counts"] else {}
    block = previous.get("batch") or {}
    block[side] = asdict(counts)
    both = all(run[f"{s}_name"] is not None for s in SIDES)
    store.finish_run(run_id, {"batch": block}, "complete" if both else "running")
