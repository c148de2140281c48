"""The engine registry's contract, which a new engine folder (vLLM, HF generate) must meet to plug in: a package
with `create(path)`, and a config module with its own keys that checks them without importing heavy packages."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
from helpers import REPO

from toolaudit import ConfigError
from toolaudit.engines import ENGINES, make_engine
from toolaudit.engines.paths import COMMON_KEYS, PathConfig


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_each_engine_meets_the_registry_contract(name):
    entry = ENGINES[name]
    config = importlib.import_module(entry.config)
    assert entry.name == name
    assert isinstance(config.KEYS, frozenset) and not config.KEYS & COMMON_KEYS
    assert callable(config.parse_options)
    assert callable(importlib.import_module(entry.package).create)


def test_reading_paths_imports_no_engine_dependency():
    code = ("import importlib, sys\n"
            "from toolaudit.engines import ENGINES\n"
            "from toolaudit.engines.paths import load_paths\n"
            "for entry in ENGINES.values(): importlib.import_module(entry.config)\n"
            "load_paths('paths.example.toml')\n"
            "print(sorted(m for m in ('torch', 'transformers', 'openai', 'vllm', 'numpy') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_an_unregistered_engine_is_a_config_error():
    with pytest.raises(ConfigError, match="paths.x: engine 'tgi' is not available"):
        make_engine(PathConfig(name="x", engine="tgi"))
