#!/usr/bin/env python3
"""`pip install ARGS` for the Makefile, done by uv where uv is at hand: the same pinned set, several times faster.

Why: on a fresh 2-core machine `make test` spent about two minutes in pip (torch, vLLM, Ray, the tracing
libraries), a sixth of the suite's 12-minute budget; uv installs the same versions, bytecode compiled, in about
40 s. uv does not read pip's configuration, so what pip is configured with (`pip config list`: find-links, index
URLs, constraints, the CA file; the `PIP_*` variables included) is passed on, and indexes are searched as pip
searches them (the best version across all of them). Where uv is missing or fails, pip itself runs the same request, so
the outcome never depends on uv.

uv's cache lives inside the venv (`.venv/.uv-cache`), not in ~/.cache/uv: on one filesystem with the venv, uv
hardlinks the installed files to it, so the cache costs almost no disk. In ~/.cache it can sit on another mount,
where uv silently copies instead and the 4 GB cache doubles the venv (the likely cause of a CI run out of disk).

    .venv/bin/python scripts/install.py [-q] ARGS...   # as `.venv/bin/pip install ARGS...`
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

_CONFIG_LINE = re.compile(r"^([^.]*)\.([a-z-]+)='(.*)'$")
_PRECEDENCE = {"global": 0, "user": 1, "site": 2, ":env:": 3}  # pip's: the environment over every file
# pip option -> uv option; values pip keeps space-separated are passed one per flag
_OPTIONS = {"find-links": "--find-links", "index-url": "--index-url", "extra-index-url": "--extra-index-url",
            "constraint": "--constraint"}


def pip_config() -> dict[str, list[str]]:
    """pip's configured values by option, each from the source pip itself would take it from."""
    try:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}
    values: dict[str, tuple[int, list[str]]] = {}
    for line in out.splitlines():
        match = _CONFIG_LINE.match(line.strip())
        if match:
            source, option, value = match.groups()
            rank = _PRECEDENCE.get(source, 0)
            if option not in values or rank >= values[option][0]:
                values[option] = (rank, value.split())
    return {option: value for option, (_, value) in values.items()}


def uv_command(uv: str, args: list[str], config: dict[str, list[str]]) -> tuple[list[str], dict[str, str]]:
    """The uv invocation (and its environment) that installs `args` as pip, so configured, would."""
    # Bytecode compiled at install, as pip does: uv leaves it to the first import by default, and where
    # PYTHONDONTWRITEBYTECODE is set (these machines set it) every process then compiled torch and vLLM again
    # (an `import vllm` 12 s instead of 5; the suite 3 minutes longer).
    cmd = [uv, "pip", "install", "--python", sys.executable, "--index-strategy", "unsafe-best-match",
           "--compile-bytecode"]
    for option, flag in _OPTIONS.items():
        for value in config.get(option, []):
            cmd += [flag, value]
    env = dict(os.environ)
    if "UV_CACHE_DIR" not in env:  # the user's choice stands
        env["UV_CACHE_DIR"] = str(Path(sys.prefix) / ".uv-cache")
    cert = config.get("cert")
    if cert and "SSL_CERT_FILE" not in env:
        env["SSL_CERT_FILE"] = cert[0]
    return cmd + args, env


def find_uv() -> str | None:
    beside = Path(sys.executable).with_name("uv")  # installed into the venv by the Makefile
    return str(beside) if beside.exists() else shutil.which("uv")


def main(args: list[str]) -> int:
    uv = find_uv()
    if uv is not None:
        cmd, env = uv_command(uv, args, pip_config())
        if subprocess.run(cmd, env=env).returncode == 0:
            return 0
        print("uv could not install this; pip installs it instead", file=sys.stderr)
    return subprocess.run([sys.executable, "-m", "pip", "install", *args]).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
