"""Secrets never stored: API keys and auth headers given through `api_key_env` or `extra_headers` (inline, or
`{ env = NAME }`) never reach the database (nor its `.snapshot` and `.wal`), fingerprints, reports, exports,
command output, logs, temporary files or error rows, even when a hostile server echoes them back.

A loopback gateway (aiohttp) that requires the keys serves three paths: `gw-a` (key from `api_key_env`), `gw-b`
(an inline Authorization and X-Api-Key, a tenant header read from a variable after a prefix; its answers echo the tenant
value) and `gw-h` (answers every request 401 with the auth headers it received in the body, raw, URL-encoded
and base64). A real `toolaudit replay` process (a matrix: gw-a against gw-b and gw-h; OPENAI_LOG=debug, TMPDIR
inside the test's folder) runs against it; the test copies the `.snapshot` and `.wal` while it is held mid-way.
Then every read command (runs, sql, summary, report, report --customer, export, fingerprint, batch export)
writes what it prints to a file, and every byte under the test's folder (inputs aside) is searched for each key
in its raw, URL-encoded and base64 forms. The scanner is shown to find a key in a control file, and the header
names are shown to be stored, so a clean scan means something.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import quote

import pytest
from aiohttp import web
from click.testing import CliRunner
from helpers import DEMO, REPO, AppThread, openai_path_toml

from toolaudit import ConfigError
from toolaudit.cli import cli
from toolaudit.engines.paths import parse_path

KEY_ENV, TENANT_ENV = "TOOLAUDIT_SECRET_TEST_KEY", "TOOLAUDIT_SECRET_TEST_TENANT"
LIMIT, CHUNK = 6, 2
SNAPSHOT_INTERVAL_S = 2.2  # > SnapshotPublisher's min_interval_s


def new_key(prefix: str) -> str:
    # '/', '+' and '=' make the URL-encoded form differ from the raw one
    return f"{prefix}-{secrets.token_hex(12)}/+="


def forms(secret: str) -> dict[str, bytes]:
    raw = secret.encode()
    return {"raw": raw, "url": quote(secret, safe="").encode(), "base64": base64.b64encode(raw),
            "base64url": base64.urlsafe_b64encode(raw)}


def leaks(root: Path, keys: dict[str, str], skip: Path) -> list[str]:
    """'file: key (form)' for every form of every key found in any file under `root` (but `skip`)."""
    found = []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and skip not in p.parents):
        data = path.read_bytes()
        found += [f"{path.relative_to(root)}: {name} ({form})" for name, key in keys.items()
                  for form, needle in forms(key).items() if needle in data]
    return found


class Gateway:
    """Requires the keys; `/h/` answers 401 and echoes the auth headers it got. Requests past `slow_after` are
    slowed, those past `hold_after` wait for `release` (so the test can copy the database's snapshot mid-run)."""

    def __init__(self, key: str, inline_auth: str, api_key: str, tenant: str):
        self.key, self.inline_auth, self.api_key, self.tenant = key, inline_auth, api_key, tenant
        self.requests = 0
        self.slow_after: int | None = None
        self.hold_after: int | None = None
        self.release = threading.Event()
        self.holding = threading.Event()  # a request waits for `release`: the run's earlier chunks are stored

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/{who}/v1/chat/completions", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.Response:
        self.requests += 1
        if self.slow_after is not None and self.slow_after < self.requests <= (self.hold_after or self.requests):
            # the second chunk arrives past the snapshot publisher's minimum interval (2 s), so the replay
            # publishes a snapshot with rows before the third chunk, which is held
            await asyncio.sleep(SNAPSHOT_INTERVAL_S)
        if self.hold_after is not None and self.requests > self.hold_after:
            self.holding.set()
            await asyncio.get_running_loop().run_in_executor(None, self.release.wait, 60)
        body = await request.json()
        h, who = request.headers, request.match_info["who"]
        if who == "h":
            echo = "; ".join(f"{k}: {v} b64={base64.b64encode(v.encode()).decode()} url={quote(v, safe='')}"
                             for k, v in h.items() if k.lower() in ("authorization", "x-api-key", "x-tenant"))
            return web.json_response({"error": {"message": f"unauthorized, received {echo}"}}, status=401)
        ok = {"a": h.get("Authorization") == f"Bearer {self.key}",
              "b": (h.get("Authorization"), h.get("X-Api-Key"), h.get("X-Tenant"))
              == (f"Bearer {self.inline_auth}", self.api_key, f"Tenant {self.tenant}")}.get(who, False)
        if not ok:
            return web.json_response({"error": {"message": f"bad credentials for {who}"}}, status=403)
        args = {"symbol": "AMZN", "limit": 5} | ({"note": f"tenant {self.tenant}"} if who == "b" else {})
        return web.json_response({
            "id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                    "name": "get_quote", "arguments": json.dumps(args)}}]}}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 9, "total_tokens": 59}})


def hold_a_snapshot_with_rows(db: Path, held: Path, gateway: Gateway) -> list[str]:
    """Copy `<db>.*` (the snapshot, the WAL) into `held` while the gateway holds the run's third chunk: the
    writer asks for a chunk only after storing the one before and publishing its snapshot, and it writes nothing
    while it waits, so the files are still. Returns the names copied."""
    import duckdb

    assert gateway.holding.wait(60), "the run never reached its held chunk"
    copied = []
    for f in db.parent.glob(f"{db.name}.*"):
        shutil.copy(f, held / f.name)
        copied.append(f.name)
    snapshot = held / Path(f"{db}.snapshot").name
    assert snapshot.exists(), copied
    with duckdb.connect(str(snapshot), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM outputs").fetchone()[0], "the snapshot holds no outputs"
    return copied


@pytest.fixture
def keys() -> dict[str, str]:
    return {"api_key_env": new_key("sk"), "inline Authorization": new_key("tok"),
            "inline X-Api-Key": new_key("xak"), "env X-Tenant": new_key("tenant")}


def paths_toml(root: str, keys: dict[str, str]) -> str:
    common = {"max_retries": 0, "timeout_s": 90, "batch_size": 4}
    inline_auth, api_key = keys["inline Authorization"], keys["inline X-Api-Key"]
    b_headers = (f'{{ Authorization = "Bearer {inline_auth}", X-Api-Key = "{api_key}", '
                 f'X-Tenant = {{ env = "{TENANT_ENV}", prefix = "Tenant " }} }}')
    return (openai_path_toml("gw-a", f"{root}/a/v1", "m", api_key_env=KEY_ENV, **common)
            + openai_path_toml("gw-b", f"{root}/b/v1", "m", extra_headers=b_headers, **common)
            + openai_path_toml("gw-h", f"{root}/h/v1", "m", api_key_env=KEY_ENV, extra_headers=(
                f'{{ X-Api-Key = "{api_key}", X-Tenant = {{ env = "{TENANT_ENV}" }} }}'), **common))


def replay(args: list[str], env: dict, out: Path, name: str) -> subprocess.Popen:
    stdout, stderr = (out / f"{name}.stdout").open("wb"), (out / f"{name}.stderr").open("wb")
    with stdout, stderr:
        return subprocess.Popen([sys.executable, "-m", "toolaudit", "replay", str(DEMO), *args], env=env,
                                stdout=stdout, stderr=stderr)


def test_keys_and_auth_headers_reach_no_file_output_or_row(tmp_path, keys, monkeypatch):
    inputs, out, tmp = tmp_path / "inputs", tmp_path / "out", tmp_path / "tmp"
    for d in (inputs, out, tmp):
        d.mkdir()
    gateway = Gateway(keys["api_key_env"], keys["inline Authorization"], keys["inline X-Api-Key"],
                      keys["env X-Tenant"])
    server = AppThread(gateway.app())
    try:
        paths = inputs / "paths.toml"  # the user's own file holds the inline values: not scanned
        paths.write_text(paths_toml(server.base_url.removesuffix("/v1"), keys))
        for name, value in ((KEY_ENV, keys["api_key_env"]), (TENANT_ENV, keys["env X-Tenant"])):
            monkeypatch.setenv(name, value)
        env = dict(os.environ, PYTHONPATH=str(REPO), TMPDIR=str(tmp), OPENAI_LOG="debug")
        db = out / "audit.duckdb"
        common = ["--paths", str(paths), "--db", str(db), "--limit", str(LIMIT), "--chunk", str(CHUNK),
                  "--schemas", str(REPO / "schemas")]

        # one remedy matrix: baseline gw-a, candidates gw-b (answers) and gw-h (hostile: every request a 401 that
        # echoes the auth headers); its third chunk is held until a snapshot with rows (and the WAL) is copied
        per_chunk = 3 * CHUNK  # requests: each call on the baseline and both candidates
        gateway.slow_after, gateway.hold_after = per_chunk, 2 * per_chunk
        proc = replay(["--baseline", "gw-a", "--candidate", "gw-b", "--candidate", "gw-h", "--run-name", "audit",
                       *common], env, out, "replay")
        held = out / "held"
        held.mkdir()
        copied = hold_a_snapshot_with_rows(db, held, gateway)
        gateway.release.set()
        assert proc.wait(timeout=120) == 0, (out / "replay.stderr").read_text()
        assert "audit.duckdb.snapshot" in copied and "audit.duckdb.wal" in copied, copied
    finally:
        gateway.release.set()
        server.close()

    runner = CliRunner()

    def run(*args: str) -> str:
        result = runner.invoke(cli, list(args))
        assert result.exit_code == 0, (args, result.output)
        (out / f"cmd-{len(list(out.glob('cmd-*')))}.txt").write_text(result.output)
        return result.output

    runs = json.loads(run("runs", "--db", str(db), "--json"))
    matrix, ok_run, hostile_run = (next(r["run_id"] for r in runs if r["name"] == n)
                                   for n in ("audit", "audit/gw-b", "audit/gw-h"))
    customer = json.loads(run("sql", "SELECT min(customer) AS c FROM calls", "--db", str(db), "--json"))[0]["c"]
    stored = json.loads(run("sql", f"SELECT options FROM runs WHERE run_id = {ok_run}", "--db", str(db),
                            "--json"))[0]["options"]
    stored = json.loads(stored) if isinstance(stored, str) else stored
    # not vacuous: the header names are stored, the values replaced, the env form kept as the variable's name
    assert stored["candidate_config"]["options"]["extra_headers"] == {
        "Authorization": "<redacted>", "X-Api-Key": "<redacted>", "X-Tenant": {"env": TENANT_ENV, "prefix": "Tenant "}}
    assert stored["candidate_fingerprint_components"]["extra_headers"] == ["Authorization", "X-Api-Key", "X-Tenant"]
    errors = json.loads(run("sql", f"SELECT error FROM outputs WHERE run_id = {hostile_run} AND error IS NOT NULL",
                            "--db", str(db), "--json"))
    # each header the server echoed (raw, base64, URL-encoded) is in the error row, its value scrubbed
    assert [e["error"] for e in errors] == [
        "HTTP 401: unauthorized, received Authorization: *** b64=*** url=***; x-api-key: *** b64=*** url=***; "
        "x-tenant: *** b64=*** url=***"] * LIMIT
    answers = run("sql", f"SELECT text FROM outputs WHERE run_id = {ok_run} AND side = 'candidate'", "--db",
                  str(db), "--json")
    assert '\\"note\\": \\"tenant ***\\"' in answers  # the tenant value the server echoed in its answer
    for run_id in (matrix, ok_run, hostile_run):
        run("summary", "--db", str(db), "--run", str(run_id), "--json")
        run("report", "--db", str(db), "--run", str(run_id), "--all-customers", "--write", "html,md,json", "-o",
            str(out / "reports"))
        run("report", "--db", str(db), "--run", str(run_id), "--customer", customer, "--write", "html,md,json",
            "-o", str(out / "reports-customer"))
    for table in ("runs", "outputs", "calls"):
        run("sql", f"SELECT * FROM {table}", "--db", str(db), "--json")
    run("export", "--db", str(db), "--as", "csv", "-o", str(out / "export-csv"))
    run("export", "--db", str(db), "--as", "parquet", "-o", str(out / "export-parquet"))
    for path in ("gw-a", "gw-b", "gw-h"):
        run("fingerprint", "--path", path, "--paths", str(paths), "--json")
        run("batch", "export", str(DEMO), "--path", path, "--paths", str(paths), "--limit", str(LIMIT), "-o",
            str(out / f"batch-{path}.jsonl"))
    refused = runner.invoke(cli, ["serve", "--path", "gw-b", "--paths", str(paths), "--port", "0"])
    (out / "serve.txt").write_text(refused.output)  # serve runs embedded paths only; it says so, naming no value
    assert refused.exit_code != 0 and "served elsewhere" in refused.output, refused.output
    assert len(list((out / "reports").rglob("*.*"))) >= 6 and len(list((out / "reports-customer").rglob("*.*"))) >= 6
    assert list((out / "export-csv").iterdir()) and list((out / "export-parquet").iterdir())
    assert (out / "audit.engines.log").exists()

    # the scanner works: it finds each form of a key written on purpose
    control = inputs / "control.bin"
    control.write_bytes(b"".join(b"x" + f + b"y" for f in forms(keys["env X-Tenant"]).values()))
    assert len(leaks(inputs, {"tenant": keys["env X-Tenant"]}, skip=out)) == len(forms(keys["env X-Tenant"]))
    sent = {f"{name} as sent": f"Bearer {keys[name]}" for name in ("api_key_env", "inline Authorization")}
    sent["env X-Tenant as sent"] = f"Tenant {keys['env X-Tenant']}"
    found = leaks(tmp_path, keys | sent, skip=inputs)
    assert not found, "\n".join(found)


def test_bad_base_urls_and_headers_fail_without_echoing_the_secret(tmp_path):
    secret = new_key("sk")

    def error(table: dict) -> str:
        with pytest.raises(ConfigError) as info:
            parse_path("p", {"engine": "openai", "model": "m"} | table)
        assert secret not in str(info.value) and quote(secret, safe="") not in str(info.value)
        return str(info.value)

    plain = secrets.token_hex(16)
    for url in (f"https://user:{secret}@gw.example.com/v1", f"https://user:{plain}@gw.example.com/v1",
                f"https://gw.example.com/v1?api_key={plain}", f"https://gw.example.com/v1?api_key={secret}",
                f"ftp://{secret}@gw.example.com/v1", f"https://gw.example.com/v1#{secret}"):
        assert error({"base_url": url}).startswith("paths.p: base_url must not carry credentials, a query"), url
        assert plain not in error({"base_url": url})
    assert error({"base_url": f"https://user:{secret}"}) == \
        "paths.p: base_url is not a valid URL (its port is not a number)"
    bad = tmp_path / "paths.toml"  # the command line says the same, and prints no part of the URL
    bad.write_text(openai_path_toml("leaky", f"https://gw.example.com/v1?api_key={plain}", "m"))
    result = CliRunner().invoke(cli, ["fingerprint", "--path", "leaky", "--paths", str(bad)])
    assert result.exit_code != 0 and "base_url must not carry credentials" in result.output, result.output
    assert plain not in result.output and "gw.example.com" not in result.output
    base = {"base_url": "https://gw.example.com/v1"}
    assert error(base | {"extra_headers": {"X-Key": secret + "\n"}}) == \
        "paths.p: extra_headers.X-Key must be printable ASCII (no line breaks or control characters)"
    assert error(base | {"extra_headers": {"X-Key": {"env": secret}}}).startswith(
        "paths.p: extra_headers.X-Key must be a string or { env = \"VARIABLE\" }")
    assert error(base | {"extra_headers": {"Content-Type": secret}}) == \
        "paths.p: extra_headers.Content-Type is set by the HTTP client itself"
    assert error(base | {"extra_headers": {"x-key": "a", "X-Key": secret}}) == \
        "paths.p: extra_headers.X-Key is given twice (header names are case-insensitive)"
    assert error(base | {"extra_headers": secret}).startswith("paths.p: extra_headers must be a table")
