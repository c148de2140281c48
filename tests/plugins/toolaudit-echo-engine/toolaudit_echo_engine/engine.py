"""`EchoEngine`: answers each request with a Hermes-style tool call derived from the request alone, so two echo
paths that pick different tools drift exactly where a request offers more than one tool."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
import warnings
from typing import Any

from toolaudit.engines import Engine, EngineRequest, EngineResult, error_result

from . import CAPABILITIES, ENGINE

log = logging.getLogger("toolaudit_echo_engine")


class EchoEngine(Engine):
    name = "echo"
    capabilities = CAPABILITIES

    def __init__(self, path):
        super().__init__(path)
        self.options = ENGINE.read(path.options)  # EchoOptions: read as fields, defaults applied

    def _load(self) -> None:
        if self.options.noisy:
            # what engines do while they load: their own logger, a progress line, a library warning, a C-level
            # write and a worker process of their own
            log.warning("echo engine: loading (a log record)")
            print("echo engine: loading weights 100%|##########|")
            warnings.warn("echo engine: a deprecated option (a Python warning)", FutureWarning, stacklevel=2)
            os.write(2, b"echo engine: written to file descriptor 2\n")
            subprocess.run([sys.executable, "-c", "import sys; print('echo worker: started', file=sys.stderr)"],
                           check=True)

    def generate(self, requests: list[EngineRequest]) -> list[EngineResult]:
        self.load()
        results = []
        for req in requests:
            start = time.perf_counter()
            try:
                text = self._answer(req)
            except Exception as exc:  # one bad request is one error row
                results.append(error_result(req.key, exc))
                continue
            if self.options.noisy:
                log.warning("echo engine: answered %s", req.key)
            elapsed = time.perf_counter() - start
            results.append(EngineResult(key=req.key, text=text, prompt_tokens=len(json.dumps(req.messages)) // 4,
                                        completion_tokens=len(text.split()), latency_s=elapsed, ttft_s=elapsed,
                                        forward_passes=1, finish_reason="stop"))
        return results

    def _answer(self, req: EngineRequest) -> str:
        functions = [t.get("function", t) for t in req.tools]
        if not functions:
            return "I have no tool for that."
        fn = functions[0] if self.options.pick == "first" else functions[-1]
        said = _last_user_text(req.messages)
        schema = fn.get("parameters") or {}
        arguments = {name: _value(schema.get("properties", {}).get(name, {}), said)
                     for name in schema.get("required", [])}
        return "<tool_call>\n" + json.dumps({"name": fn["name"], "arguments": arguments}) + "\n</tool_call>"

    def path_components(self) -> dict[str, Any]:
        return {"pick": self.options.pick, "max_tokens": self.path.max_tokens}


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    for m in reversed(messages):
        if m.get("role") == "user":
            content = m.get("content")
            if isinstance(content, list):
                return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            return content or ""
    return ""


def _value(schema: dict[str, Any], said: str) -> Any:
    """A value of the property's type taken from what the user said: its first number, or its last word."""
    kind = schema.get("type")
    if kind in ("integer", "number"):
        number = re.search(r"\d+", said)
        return int(number.group()) if number else len(said.split())
    if kind == "boolean":
        return True
    if "enum" in schema:
        return schema["enum"][0]
    words = re.findall(r"[\w.@-]+", said)
    return words[-1] if words else ""
