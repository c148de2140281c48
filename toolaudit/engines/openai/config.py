"""The openai engine's own `[paths.NAME]` keys and their validation. No openai import: paths.toml is read (and
checked) before any engine loads.

`parse_options` checks a table's keys when paths.toml is read; `options_for` turns a path into `OpenAIOptions`
when the engine is created, checking again because a path can also be built or changed in code. `ENGINE` is
what the `toolaudit.engines` entry point `openai` names.

Secrets: the key comes only from the variable `api_key_env` names; `extra_headers` values are secrets however
given (inline, or `{ env = "NAME" }`), so `stored_options` keeps header names only, and `base_url` may not carry
credentials or a query (rejected, never echoed in the error: a URL with `user:pass@` or `?api_key=` is a secret).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Callable
from urllib.parse import urlsplit

from toolaudit import ConfigError

from ..base import Capabilities
from ..logs import LogNote
from ..paths import PathConfig
from ..registry import EngineSpec

OPTION_KEYS = ("base_url", "api_key_env", "extra_headers", "extra_body", "tool_choice", "logprobs", "top_logprobs",
               "concurrency", "timeout_s", "max_retries", "stream", "backoff_s", "backoff_max_s", "metrics_url",
               "samples_via", "within_s")
KEYS = frozenset(OPTION_KEYS)
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
    """The `engine = "openai"` keys of one path, validated."""

    base_url: str
    api_key_env: str | None = None
    # header name -> the value inline, or {"env": NAME, "prefix": "Bearer "}: prefix + that variable's value,
    # read when the engine is created (engine.header_values). Sent with every request (gateways' X-Api-Key,
    # OpenAI-Organization, ...).
    extra_headers: dict[str, str | dict[str, str]] = field(default_factory=dict)
    extra_body: dict[str, Any] = field(default_factory=dict)
    tool_choice: str | dict[str, Any] | None = None
    logprobs: bool = False
    top_logprobs: int = 2  # two are needed for margins (top-1 minus top-2 logprob)
    concurrency: int = 8
    timeout_s: float = 60.0  # per attempt, whole response (streamed or not)
    max_retries: int = 3
    stream: bool = False
    backoff_s: float = 0.5  # first retry waits 0.25..0.5 s, then doubling, up to backoff_max_s
    backoff_max_s: float = 8.0
    # where the server's Prometheus counters are (metrics.py): None = the base URL's origin + /metrics, tried
    # quietly; a URL = that one (a failure warns); False = never read
    metrics_url: str | bool | None = None
    # how a sampled call's N samples are asked for: "n" (one request with n = N, choice i is sample i), "seed" (N
    # requests, each with its sample's seed), "auto" (n, falling back to seed for good once the endpoint refuses n
    # or returns fewer choices). See the engine's module docstring.
    samples_via: str = "auto"
    # a replay's probe sets it (`replay.probe`, declared in CAPABILITIES.overrides): each generate() call sends its
    # requests one at a time, one attempt each, all within this many seconds, none after a failure (within.py)
    within_s: float | None = None


def parse_options(table: dict[str, Any], fail: _Fail) -> dict[str, Any]:
    """The openai keys of a path table, as given (defaults are applied by `options_for`), once they check out."""
    opts = {k: v for k, v in table.items() if k in KEYS}
    _options(opts, fail, default_concurrency=1)
    body = opts.get("extra_body", {})
    if table.get("top_k") and "top_k" in body:
        raise fail("extra_body.top_k", "is given twice: the path's top_k is sent as top_k already")
    return opts


def options_for(path: PathConfig) -> OpenAIOptions:
    """Validate an openai path's keys; errors are `ConfigError`s naming the path and the key."""
    where = f"paths.{path.name}"

    def fail(key: str, message: str) -> ConfigError:
        return ConfigError(f"{where}: {key} {message}")

    given, defaults = asdict(path), asdict(PathConfig(name=path.name))
    for key in _TORCH_ONLY:
        if given[key] != defaults[key]:
            raise fail(key, "is a torch engine key; an openai path's server decides it "
                            "(pass server switches in extra_body)")
    opts = dict(path.options)
    unknown = sorted(set(opts) - KEYS)
    if unknown:
        raise fail(unknown[0], f"is not a key the openai engine knows ({', '.join(OPTION_KEYS)})")
    options = _options(opts, fail, default_concurrency=path.batch_size)
    if path.top_k and "top_k" in options.extra_body:
        raise fail("extra_body.top_k", "is given twice: the path's top_k is sent as top_k already")
    return options


def _options(opts: dict[str, Any], fail: _Fail, default_concurrency: int) -> OpenAIOptions:
    if "base_url" not in opts:
        raise fail("base_url", "is required for engine openai (e.g. \"http://127.0.0.1:8000/v1\")")
    base_url = _http_url("base_url", opts["base_url"], fail)
    metrics_url = opts.get("metrics_url")
    if metrics_url is not None and metrics_url is not False:
        if metrics_url is True:
            raise fail("metrics_url", "must be a URL, or false to never read the server's counters (leave it out "
                                      "for the base URL's /metrics)")
        metrics_url = _http_url("metrics_url", metrics_url, fail)
    env = opts.get("api_key_env")
    if env is not None and (not isinstance(env, str) or not _ENV_NAME.fullmatch(env)):
        raise fail("api_key_env", "must be the NAME of an environment variable (e.g. \"OPENAI_API_KEY\"), "
                                  "not the key itself")
    extra_headers = _headers(opts.get("extra_headers", {}), fail)
    extra_body = opts.get("extra_body", {})
    if not isinstance(extra_body, dict):
        raise fail("extra_body", "must be a table of fields added to each request body")
    tool_choice = opts.get("tool_choice")
    if tool_choice is not None and not isinstance(tool_choice, (str, dict)):
        raise fail("tool_choice", "must be \"auto\", \"none\", \"required\" or a table naming a function")
    samples_via = opts.get("samples_via", "auto")
    if samples_via not in SAMPLES_VIA:
        raise fail("samples_via", f"must be one of {', '.join(SAMPLES_VIA)} (got {samples_via!r})")
    for key in ("logprobs", "stream"):
        if not isinstance(opts.get(key, False), bool):
            raise fail(key, f"must be true or false (got {opts[key]!r})")
    top = opts.get("top_logprobs", 2)
    if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20:
        raise fail("top_logprobs", f"must be an integer from 0 to 20 (got {top!r})")
    concurrency = opts.get("concurrency", default_concurrency)
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise fail("concurrency", f"must be a positive integer (got {concurrency!r})")
    retries = opts.get("max_retries", 3)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise fail("max_retries", f"must be an integer >= 0 (got {retries!r})")
    numbers = {}
    for key, default, positive in (("timeout_s", 60.0, True), ("backoff_s", 0.5, False),
                                   ("backoff_max_s", 8.0, False)):
        value = opts.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (positive and not value):
            raise fail(key, f"must be a number {'> 0' if positive else '>= 0'} (got {value!r})")
        numbers[key] = float(value)
    within = opts.get("within_s")
    if within is not None and (isinstance(within, bool) or not isinstance(within, (int, float)) or within <= 0):
        raise fail("within_s", f"must be a number > 0 (got {within!r})")
    return OpenAIOptions(base_url=base_url.rstrip("/"), api_key_env=env, extra_headers=extra_headers,
                         extra_body=extra_body,
                         tool_choice=tool_choice, logprobs=opts.get("logprobs", False), top_logprobs=top,
                         concurrency=concurrency, max_retries=retries, stream=opts.get("stream", False),
                         metrics_url=metrics_url, samples_via=samples_via,
                         within_s=None if within is None else float(within), **numbers)


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
ENGINE = EngineSpec(name="openai", factory="toolaudit.engines.openai.engine:OpenAIEngine", keys=KEYS,
                    parse_options=parse_options, capabilities=CAPABILITIES, stored_options=stored_options,
                    notes=NOTES)
