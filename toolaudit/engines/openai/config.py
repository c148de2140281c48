"""The openai engine's own `[paths.NAME]` keys and their validation. No openai import: paths.toml is read (and
checked) before any engine loads.

The registry checks a table against `OpenAIOptions` (and `check`) when paths.toml is read; `options_for` turns a
path into `OpenAIOptions` when the engine is created, checking again because a path can also be built or changed
in code. `ENGINE` is what the `toolaudit.engines` entry point `openai` names.

Secrets: the key comes only from the variable `api_key_env` names; `extra_headers` values are secrets however
given (inline, or `{ env = "NAME" }`), so `stored_options` keeps header names only, and `base_url` may not carry
credentials or a query (rejected, never echoed in the error: a URL with `user:pass@` or `?api_key=` is a secret).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Callable
from urllib.parse import urlsplit

from toolaudit import ConfigError

from ..base import Capabilities
from ..logs import LogNote
from ..options import key
from ..paths import PathConfig
from ..registry import EngineSpec

# PathConfig fields that only an embedded engine uses: on an HTTP path the server decides them.
_TORCH_ONLY = ("dtype", "device", "speculative", "prompt", "prefix_caching")
_Fail = Callable[[str, str], ConfigError]
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PLACEHOLDER = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an RFC 9110 token
# Headers the HTTP client writes itself from the body and the URL: a path setting them would corrupt requests.
_CLIENT_HEADERS = frozenset({"content-type", "content-length", "host", "transfer-encoding", "connection"})
REDACTED = "<redacted>"  # what is stored in place of an inline header value
SAMPLES_VIA = ("auto", "n", "seed")


@dataclass(frozen=True)
class OpenAIOptions:
    """The `engine = "openai"` keys of one path. `concurrency` None: the path's batch_size (`options_for`
    resolves it, with `base_url` without its trailing slash)."""

    base_url: str | None = key(None, doc="the endpoint, e.g. http://127.0.0.1:8000/v1 (required)")
    api_key_env: Any = key(None, doc="NAME of the variable holding the key (`check`: never echoed)")
    # header name -> the value inline, or {"env": NAME, "prefix": "Bearer "}: prefix + that variable's value,
    # read when the engine is created (engine.header_values). Sent with every request (gateways' X-Api-Key,
    # OpenAI-Organization, ...).
    extra_headers: dict = key({}, what="a table of header name -> value (or { env = \"VARIABLE\" })")
    extra_body: dict = key({}, what="a table of fields added to each request body")
    tool_choice: Any = key(None, doc="\"auto\", \"none\", \"required\" or a table naming a function")
    logprobs: bool = key(False)
    top_logprobs: int = key(2, low=0, high=20, doc="two are needed for margins (top-1 minus top-2 logprob)")
    concurrency: int | None = key(None, low=1, doc="requests in flight (None: the path's batch_size)")
    timeout_s: float = key(60.0, low=0, low_open=True, doc="per attempt, whole response (streamed or not)")
    max_retries: int = key(3, low=0)
    stream: bool = key(False)
    backoff_s: float = key(0.5, low=0, doc="first retry waits 0.25..0.5 s, then doubling, up to backoff_max_s")
    backoff_max_s: float = key(8.0, low=0)
    # where the server's Prometheus counters are (metrics.py): None = the base URL's origin + /metrics, tried
    # quietly; a URL = that one (a failure warns); False = never read
    metrics_url: Any = key(None)
    # how a sampled call's N samples are asked for: "n" (one request with n = N, choice i is sample i), "seed" (N
    # requests, each with its sample's seed), "auto" (n, falling back to seed for good once the endpoint refuses n
    # or returns fewer choices). See the engine's module docstring.
    samples_via: str = key("auto", allowed=SAMPLES_VIA)
    # a replay's probe sets it (`replay.probe`, declared in CAPABILITIES.overrides): each generate() call sends its
    # requests one at a time, one attempt each, all within this many seconds, none after a failure (within.py)
    within_s: float | None = key(None, low=0, low_open=True)


def check(opts: OpenAIOptions, table: dict[str, Any], fail: _Fail) -> None:
    """What a field's type cannot say: base_url required and safe, the key's variable a name, the headers, the
    tool choice, metrics_url, and top_k not given twice."""
    if opts.base_url is None:
        raise fail("base_url", "is required for engine openai (e.g. \"http://127.0.0.1:8000/v1\")")
    _http_url("base_url", opts.base_url, fail)
    if opts.metrics_url is not None and opts.metrics_url is not False:
        if opts.metrics_url is True:
            raise fail("metrics_url", "must be a URL, or false to never read the server's counters (leave it out "
                                      "for the base URL's /metrics)")
        _http_url("metrics_url", opts.metrics_url, fail)
    env = opts.api_key_env
    if env is not None and (not isinstance(env, str) or not _ENV_NAME.fullmatch(env)):
        raise fail("api_key_env", "must be the NAME of an environment variable (e.g. \"OPENAI_API_KEY\"), "
                                  "not the key itself")
    _headers(opts.extra_headers, fail)
    if opts.tool_choice is not None and not isinstance(opts.tool_choice, (str, dict)):
        raise fail("tool_choice", "must be \"auto\", \"none\", \"required\" or a table naming a function")
    if table.get("top_k") and "top_k" in opts.extra_body:
        raise fail("extra_body.top_k", "is given twice: the path's top_k is sent as top_k already")


def options_for(path: PathConfig) -> OpenAIOptions:
    """An openai path's keys, typed, checked again (a path can be built or changed in code): errors are
    `ConfigError`s naming the path and the key."""
    where = f"paths.{path.name}"

    def fail(key: str, message: str) -> ConfigError:
        return ConfigError(f"{where}: {key} {message}")

    given, defaults = asdict(path), asdict(PathConfig(name=path.name))
    for name in _TORCH_ONLY:
        if given[name] != defaults[name]:
            raise fail(name, "is a torch engine key; an openai path's server decides it "
                             "(pass server switches in extra_body)")
    unknown = sorted(set(path.options) - KEYS)
    if unknown:
        raise fail(unknown[0], f"is not a key the openai engine knows ({', '.join(OPTION_KEYS)})")
    opts = ENGINE.typed({**path.options, "top_k": path.top_k}, fail)
    return replace(opts, base_url=opts.base_url.rstrip("/"), concurrency=opts.concurrency or path.batch_size)


def _http_url(key: str, url: Any, fail: _Fail) -> str:
    """An http(s) URL with a host and no credentials, query or fragment (the URL is not echoed then)."""
    if not isinstance(url, str):
        raise fail(key, "must be a string")
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. a bad IPv6 literal: the URL is not echoed, it may hold a secret
        raise fail(key, "is not a valid URL") from None
    # "@" anywhere: userinfo, also where a "/" in the secret moved it out of the netloc. Not echoed: these parts
    # are where URLs carry keys.
    if "@" in url or parts.query or parts.fragment or "?" in url or "#" in url:
        raise fail(key, "must not carry credentials, a query or a fragment (give the key with "
                        f"api_key_env or extra_headers; nothing in {key} is treated as a secret)")
    try:
        parts.port  # noqa: B018 -- raises for a bad port, e.g. "user:KEY" written without its "@host"
    except ValueError:
        raise fail(key, "is not a valid URL (its port is not a number)") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise fail(key, f"must be an http(s) URL with a host (got {url!r})")
    return url


def _headers(table: Any, fail: _Fail) -> dict[str, str | dict[str, str]]:
    """`extra_headers`: name -> inline value or `{ env = "NAME" }` (optionally `prefix = "Bearer "`, sent before
    the variable's value). Errors name the header, never its value."""
    if not isinstance(table, dict):
        raise fail("extra_headers", "must be a table of header name -> value (or { env = \"VARIABLE\" })")
    seen: set[str] = set()
    for name, value in table.items():
        key = f"extra_headers.{name}"
        if not _HEADER_NAME.fullmatch(name):
            raise fail("extra_headers", f"{name!r} is not a valid header name")
        if name.lower() in _CLIENT_HEADERS:
            raise fail(key, "is set by the HTTP client itself")
        if name.lower() in seen:
            raise fail(key, "is given twice (header names are case-insensitive)")
        seen.add(name.lower())
        if isinstance(value, dict):
            env, prefix = value.get("env"), value.get("prefix", "")
            if not set(value) <= {"env", "prefix"} or not isinstance(env, str) or not _ENV_NAME.fullmatch(env):
                raise fail(key, "must be a string or { env = \"VARIABLE\" } naming an environment variable "
                                "(optionally with prefix = \"Bearer \")")
            if not isinstance(prefix, str) or not _printable(prefix):
                raise fail(f"{key}.prefix", "must be printable ASCII, e.g. \"Bearer \"")
        elif not isinstance(value, str) or not value:
            raise fail(key, "must be a non-empty string or { env = \"VARIABLE\" }")
        elif not _printable(value):  # httpx would echo it in its error
            raise fail(key, "must be printable ASCII (no line breaks or control characters)")
        elif _PLACEHOLDER.search(value):
            raise fail(key, "holds a ${...} placeholder, which is not expanded: write { env = \"VARIABLE\" } "
                            "(with prefix = \"Bearer \" for a scheme before it)")
    return dict(table)


def _printable(text: str) -> bool:
    return text.isascii() and text.isprintable()


def stored_options(options: dict[str, Any]) -> dict[str, Any]:
    """The options as a run may store them (run options, config fingerprints): `extra_headers` keeps its names,
    inline values become `REDACTED` and `{ env = NAME, prefix = ... }` stays (a variable's name is no secret)."""
    headers = options.get("extra_headers")
    if not isinstance(headers, dict) or not headers:
        return options
    return {**options, "extra_headers": {name: value if isinstance(value, dict) else REDACTED
                                         for name, value in headers.items()}}


# The server decides the model's numerics and tokenizer: margins come only from its logprobs (`logprobs = true`),
# and token ids cannot be decoded here. `within_s` is what a replay's probe sets on the paths it probes.
CAPABILITIES = Capabilities(sees_logits=False, decodes_tokens=False, holds_together=True, in_process=False,
                            overrides=frozenset({"within_s"}))
# What metrics.py says while a replay runs (in the engine log), repeated to the user once.
NOTES = (
    LogNote(r"other traffic shared the server during the replay",
            "other clients used an openai path's server during the replay: its acceptance (read from the server's "
            "/metrics) is the server's, not the run's (the path is named in the engine log)"),
    LogNote(r"may be one replica's of several behind a load balancer",
            "an openai path's server counted fewer requests than it answered: its /metrics is likely one replica's "
            "behind a load balancer, and the acceptance covers part of the run (see the engine log)"),
    LogNote(r"metrics_url .* (could not be read|holds none of vLLM's counters)",
            "an openai path's metrics_url gave no spec-decode counters: its acceptance is unknown (see the "
            "engine log)"),
)
ENGINE = EngineSpec(name="openai", factory="toolaudit.engines.openai.engine:OpenAIEngine", options=OpenAIOptions,
                    check=check, store_defaults=False, capabilities=CAPABILITIES, stored_options=stored_options,
                    notes=NOTES)
OPTION_KEYS = tuple(f.name for f in fields(OpenAIOptions))
KEYS = ENGINE.keys
