"""The openai engine's path keys: a bad key or value is a `ConfigError` naming the path and the key, raised when
paths.toml is read or, for what needs the environment (the API key), when the engine is created."""

from __future__ import annotations

import pytest

from toolaudit import ConfigError
from toolaudit.engines import make_engine
from toolaudit.engines.paths import parse_path


@pytest.mark.parametrize("table, message", [
    ({}, "paths.p: base_url is required for engine openai"),
    ({"base_url": "ftp://x"}, "paths.p: base_url must be an http(s) URL with a host (got 'ftp://x')"),
    ({"base_url": "http://u:pw@127.0.0.1/v1"}, "paths.p: base_url must not carry credentials"),
    ({"base_url": "https://api.example.com/v1"}, "paths.p: api_key_env is required for api.example.com"),
    ({"base_url": "http://127.0.0.1/v1", "api_key_env": "TOOLAUDIT_NOT_SET_ANYWHERE"},
     "paths.p: api_key_env names $TOOLAUDIT_NOT_SET_ANYWHERE, which is not set"),
    ({"base_url": "http://127.0.0.1/v1", "api_key_env": "sk-abc 123"},
     "paths.p: api_key_env must be the NAME of an environment variable"),
    ({"base_url": "http://127.0.0.1/v1", "concurency": 4}, "paths.p: concurency is not a key the openai engine knows"),
    ({"base_url": "http://127.0.0.1/v1", "speculative": {"method": "ngram"}},
     "paths.p: speculative is a torch engine key"),
    ({"base_url": "http://127.0.0.1/v1", "dtype": "float32"}, "paths.p: dtype is a torch engine key"),
    ({"base_url": "http://127.0.0.1/v1", "max_retries": -1}, "paths.p: max_retries must be an integer >= 0"),
    ({"base_url": "http://127.0.0.1/v1", "timeout_s": 0}, "paths.p: timeout_s must be a number > 0"),
    ({"base_url": "http://127.0.0.1/v1", "stream": "yes"}, "paths.p: stream must be true or false"),
    ({"base_url": "http://127.0.0.1/v1", "extra_body": "x"}, "paths.p: extra_body must be a table"),
    ({"base_url": "http://127.0.0.1/v1", "top_logprobs": 21}, "paths.p: top_logprobs must be an integer from 0"),
    ({"base_url": "http://127.0.0.1/v1", "metrics_url": True}, "paths.p: metrics_url must be a URL, or false"),
    ({"base_url": "http://127.0.0.1/v1", "metrics_url": "http://127.0.0.1/metrics?token=x"},
     "paths.p: metrics_url must not carry credentials, a query or a fragment"),
    ({"base_url": "http://127.0.0.1/v1", "metrics_url": 8000}, "paths.p: metrics_url must be a string"),
    ({"base_url": "http://127.0.0.1/v1", "samples_via": "both"}, "paths.p: samples_via must be one of auto, n, seed"),
    ({"base_url": "http://127.0.0.1/v1", "top_k": 5, "extra_body": {"top_k": 50}},
     "paths.p: extra_body.top_k is given twice"),
])
def test_config_errors_name_the_path_and_key(monkeypatch, table, message):
    monkeypatch.delenv("TOOLAUDIT_NOT_SET_ANYWHERE", raising=False)
    with pytest.raises(ConfigError) as err:
        make_engine(parse_path("p", {"engine": "openai", **table}))
    assert str(err.value).startswith(message)


GATEWAY = {"engine": "openai", "base_url": "https://gw.example.com/v1", "model": "m"}


def test_extra_headers_are_sent_but_stored_and_fingerprinted_by_name_only(monkeypatch):
    monkeypatch.setenv("TOOLAUDIT_TEST_GW_KEY", "gw-secret-from-env")
    path = parse_path("gw", GATEWAY | {"extra_headers": {"X-Api-Key": {"env": "TOOLAUDIT_TEST_GW_KEY"},
                                                        "Authorization": "Bearer inline-secret-123"}})
    engine = make_engine(path)  # no api_key_env needed: the gateway authenticates by header
    assert engine._headers == {"X-Api-Key": "gw-secret-from-env", "Authorization": "Bearer inline-secret-123"}
    assert path.config_dict()["options"]["extra_headers"] == {"X-Api-Key": {"env": "TOOLAUDIT_TEST_GW_KEY"},
                                                             "Authorization": "<redacted>"}
    assert path.options["extra_headers"]["Authorization"] == "Bearer inline-secret-123"  # only the copy redacts
    components = engine.fingerprint_components()
    assert components["extra_headers"] == ["Authorization", "X-Api-Key"]
    assert "secret" not in repr(components) + repr(path.config_dict())
    # the same path without headers keeps the fingerprint components it had before extra_headers existed
    plain = make_engine(parse_path("p", GATEWAY | {"base_url": "http://127.0.0.1/v1"}))
    assert "extra_headers" not in plain.fingerprint_components()


def test_an_unset_header_variable_names_the_path_header_and_variable():
    path = parse_path("gw", GATEWAY | {"extra_headers": {"X-Api-Key": {"env": "TOOLAUDIT_NOT_SET_ANYWHERE"}}})
    with pytest.raises(ConfigError, match=r"^paths\.gw: extra_headers\.X-Api-Key names \$TOOLAUDIT_NOT_SET_ANYWHERE, "
                                          r"which is not set"):
        make_engine(path)


def test_the_scrubber_replaces_each_form_of_a_secret():
    import base64
    from urllib.parse import quote

    from toolaudit.engines.openai.engine import Scrubber

    token = "tok/with+chars=="
    scrub = Scrubber([f"Bearer {token}", "short"])
    echoed = f"got Bearer {token} | {token} | {quote(token, safe='')} | {base64.b64encode(token.encode()).decode()}"
    assert scrub(echoed) == "got *** | *** | *** | ***"
    assert scrub("a short answer") == "a short answer"  # under MIN_SCRUBBED: not a key, left alone
    assert not Scrubber([]) and Scrubber([])("x") == "x"


def test_an_env_header_takes_a_prefix_and_a_placeholder_is_refused(monkeypatch):
    monkeypatch.setenv("TOOLAUDIT_TEST_GW_KEY", "gw-secret-from-env")
    path = parse_path("gw", GATEWAY | {"extra_headers": {
        "Authorization": {"env": "TOOLAUDIT_TEST_GW_KEY", "prefix": "Token "}}})
    assert make_engine(path)._headers == {"Authorization": "Token gw-secret-from-env"}
    assert path.config_dict()["options"]["extra_headers"] == {
        "Authorization": {"env": "TOOLAUDIT_TEST_GW_KEY", "prefix": "Token "}}
    with pytest.raises(ConfigError, match=r"^paths\.gw: extra_headers\.Authorization holds a \$\{\.\.\.\} "
                                          r"placeholder, which is not expanded"):
        parse_path("gw", GATEWAY | {"extra_headers": {"Authorization": "Bearer ${GATEWAY_KEY}"}})
    with pytest.raises(ConfigError, match=r"^paths\.gw: extra_headers\.X-Key must be a string or"):
        parse_path("gw", GATEWAY | {"extra_headers": {"X-Key": {"env": "K", "suffix": "x"}}})


def test_sampling_settings_are_fingerprinted_only_where_set():
    """Paths that set none of top_p, top_k, samples keep their fingerprints; samples_via counts from 2 samples."""
    base = {"engine": "openai", "base_url": "http://127.0.0.1/v1", "model": "m", "temperature": 1.0}
    plain = make_engine(parse_path("p", base)).fingerprint_components()["sampling"]
    assert set(plain) == {"temperature", "max_tokens", "seed", "stop", "top_logprobs"}
    many = make_engine(parse_path("p", {**base, "top_k": 5, "samples": 4, "samples_via": "seed"}))
    assert many.fingerprint_components()["sampling"] == {**plain, "top_k": 5, "samples": 4, "samples_via": "seed"}
