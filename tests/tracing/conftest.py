"""One `toolaudit serve` of the tiny echo model (tool calls prefilled) for every instrumentation test."""

from __future__ import annotations

import pytest

from tests.helpers import ServeProcess, build_tiny_model, torch_path_toml
from tests.tracing.agent import PREFILL


@pytest.fixture(scope="session")
def served(tmp_path_factory) -> str:
    """The base URL (…/v1) of a served tiny model whose every answer is a get_weather tool call."""
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("served")
    model = build_tiny_model(root / "model", echo=True)
    paths = root / "paths.toml"
    paths.write_text(torch_path_toml("tiny", model, max_tokens=3, prefill=PREFILL))
    server = ServeProcess(paths, "tiny", root / "serve.log")
    try:
        yield server.wait()
    finally:
        server.stop()
