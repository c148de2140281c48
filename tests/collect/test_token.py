"""`toolaudit collect --token-env VAR` for real: a receiver subprocess on loopback that only serves requests bearing
the token (read from the variable, never from argv), answering the rest 401 in the request's encoding with
nothing written; the token in no file the receiver writes nor in its log; missing or empty variables stop it at
startup; binding beyond loopback without a token warns."""

from __future__ import annotations

import json
import secrets

import pytest
from click.testing import CliRunner
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from toolaudit.cli import cli
from toolaudit.collect.receiver import BearerCheck, is_loopback

from .support import JSON, PROTOBUF, CollectProcess, chat_attrs, export, send, span, stored_spans

VAR = "TOOLAUDIT_TEST_COLLECT_TOKEN"


@pytest.fixture
def guarded(tmp_path, monkeypatch):
    token = "tk-" + secrets.token_urlsafe(24)
    monkeypatch.setenv(VAR, token)  # the subprocess inherits the environment: the token never goes in argv
    proc = CollectProcess(tmp_path / "collected", tmp_path / "collect.log", "--token-env", VAR)
    yield proc, token
    proc.stop()


def test_only_requests_bearing_the_token_are_served(guarded):
    proc, token = guarded
    url = proc.url + "/v1/traces"
    body = json.dumps(export(span(chat_attrs("s1", "acme")))).encode()
    for headers in ({}, {"Authorization": "Bearer wrong-" + token[3:]}, {"Authorization": f"Basic {token}"},
                    {"Authorization": f"Bearer {token[:-1]}"}, {"Authorization": f"Bearer {token}x"},
                    {"Authorization": token}):
        status, answer_headers, answer = send(url, body, headers=headers)
        assert status == 401, headers
        assert answer_headers["WWW-Authenticate"] == "Bearer" and answer_headers["Content-Type"] == JSON
        assert json.loads(answer)["code"] == 16  # google.rpc.Code UNAUTHENTICATED
        assert token.encode() not in answer
    # a protobuf exporter gets its google.rpc.Status in protobuf; the logs route is guarded too
    status, answer_headers, answer = send(url, ExportTraceServiceRequest().SerializeToString(), PROTOBUF)
    assert (status, answer_headers["Content-Type"], answer[:2]) == (401, PROTOBUF, b"\x08\x10")
    assert send(proc.url + "/v1/logs", b"{}")[0] == 401
    assert not list(proc.folder.glob("traces-*"))  # nothing refused was written

    good = span(chat_attrs("s1", "acme"))
    status, _, answer = send(url, json.dumps(export(good)).encode(), headers={"Authorization": f"Bearer {token}"})
    assert (status, json.loads(answer)) == (200, {})
    other = span(chat_attrs("s2", "acme"))  # the scheme is case-insensitive (RFC 9110)
    assert send(url, json.dumps(export(other)).encode(), headers={"Authorization": f"bearer {token}"})[0] == 200
    assert [s["spanId"] for s in stored_spans(proc.folder)] == [good["spanId"], other["spanId"]]

    assert proc.stop() == 0
    log = proc.log.read_text()
    assert "requests need the bearer token" in log and "8 requests refused" in log
    assert "warning" not in log
    written = [p for p in proc.folder.iterdir() if p.is_file()] + [proc.log]
    assert all(token.encode() not in p.read_bytes() for p in written)


def test_the_sdk_exporter_sends_the_token_as_a_header(guarded):
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="the tracing extra is not installed")
    from .support import export_with_sdk

    proc, token = guarded
    sent = export_with_sdk(proc.url, {"conv-1": "acme"}, calls=1, headers={"Authorization": f"Bearer {token}"})
    stored = {s["spanId"] for s in stored_spans(proc.folder)}  # the chat span (and its tool span)
    assert sent["conv-1"][0][1] in stored


@pytest.mark.parametrize("value, message", [
    (None, f"${VAR} is not set"),
    ("", f"${VAR} is empty"),
    ("  \t", f"${VAR} is empty"),
    ("two words-sekrit", "spaces or control characters"),
])
def test_a_missing_or_unusable_token_stops_it_at_startup(tmp_path, monkeypatch, value, message):
    if value is None:
        monkeypatch.delenv(VAR, raising=False)
    else:
        monkeypatch.setenv(VAR, value)
    result = CliRunner().invoke(cli, ["collect", "--token-env", VAR, "--port", "0", "--dir", str(tmp_path / "c")])
    assert result.exit_code == 2 and message in result.output
    assert "sekrit" not in result.output  # the value is never echoed
    assert not (tmp_path / "c").exists()  # refused before anything was bound or created


def test_binding_beyond_loopback_without_a_token_warns(tmp_path, monkeypatch):
    proc = CollectProcess(tmp_path / "c", tmp_path / "log", "--host", "0.0.0.0")
    assert proc.stop() == 0  # no request is sent: the warning comes before the address
    assert "warning: listening on 0.0.0.0 beyond loopback with no token" in (tmp_path / "log").read_text()
    monkeypatch.setenv(VAR, "tk-" + secrets.token_urlsafe(16))
    proc = CollectProcess(tmp_path / "c", tmp_path / "log2", "--host", "0.0.0.0", "--token-env", VAR)
    proc.stop()
    assert "warning" not in (tmp_path / "log2").read_text()


def test_loopback_and_the_bearer_check():
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.1", "example.com"))
    check = BearerCheck("s3cr3t-token")
    assert check.allows("Bearer s3cr3t-token") and check.allows("BEARER  s3cr3t-token ")
    assert not any(check.allows(h) for h in (None, "", "Bearer", "Bearer s3cr3t", "Token s3cr3t-token",
                                             "Bearer s3cr3t-token2", "Bearer \udcff"))
