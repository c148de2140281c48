"""scripts/install.py: uv gets what pip is configured with, and pip runs the request where uv cannot."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from conftest import REPO

spec = importlib.util.spec_from_file_location("install_script", REPO / "scripts" / "install.py")
install = importlib.util.module_from_spec(spec)
spec.loader.exec_module(install)


def test_pip_configuration_reaches_uv(monkeypatch):
    listing = (":env:.find-links='/srv/wheels'\nglobal.cert='/etc/ssl/certs/ca.crt'\n"  # pip lists :env: first
               "global.extra-index-url='file:///a/simple file:///b/simple'\nglobal.find-links='/opt/wheels'\n"
               "global.constraint='/etc/c.txt'\nglobal.timeout='60'\n")
    monkeypatch.setattr(install.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=listing, stderr=""))
    config = install.pip_config()
    assert config["find-links"] == ["/srv/wheels"]  # the environment's value wins, as in pip
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    cmd, env = install.uv_command("uv", ["-q", "torch==2.13.0"], config)
    assert cmd[:4] == ["uv", "pip", "install", "--python"] and cmd[-2:] == ["-q", "torch==2.13.0"]
    pairs = list(zip(cmd, cmd[1:]))
    assert ("--extra-index-url", "file:///a/simple") in pairs and ("--extra-index-url", "file:///b/simple") in pairs
    assert ("--find-links", "/srv/wheels") in pairs and ("--constraint", "/etc/c.txt") in pairs
    assert ("--index-strategy", "unsafe-best-match") in pairs  # pip's search: the best version of every index
    assert "--compile-bytecode" in cmd  # as pip does: with PYTHONDONTWRITEBYTECODE, imports would never cache it
    assert "--timeout" not in cmd and env["SSL_CERT_FILE"] == "/etc/ssl/certs/ca.crt"


def test_the_cache_sits_inside_the_venv_so_installs_hardlink_to_it(monkeypatch, tmp_path):
    monkeypatch.delenv("UV_CACHE_DIR", raising=False)
    _, env = install.uv_command("uv", ["x"], {})
    assert Path(env["UV_CACHE_DIR"]) == Path(sys.prefix) / ".uv-cache"
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path))  # the user's own cache stands
    assert install.uv_command("uv", ["x"], {})[1]["UV_CACHE_DIR"] == str(tmp_path)


def test_pip_runs_the_request_where_uv_fails(monkeypatch):
    calls = []

    def run(cmd, **kwargs):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 2 if cmd[0] == "uv" else 0, stdout="", stderr="")

    monkeypatch.setattr(install, "find_uv", lambda: "uv")
    monkeypatch.setattr(install, "pip_config", dict)
    monkeypatch.setattr(install.subprocess, "run", run)
    assert install.main(["-q", "nothing-such==1"]) == 0
    assert calls[-1] == [sys.executable, "-m", "pip", "install", "-q", "nothing-such==1"]
    monkeypatch.setattr(install, "find_uv", lambda: None)
    calls.clear()
    assert install.main(["x"]) == 0 and calls == [[sys.executable, "-m", "pip", "install", "x"]]
