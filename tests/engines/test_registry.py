"""The engine registry's contract, which every engine (built-in or plug-in) meets: an `EngineSpec` named by a
`toolaudit.engines` entry point, with its own keys checked without importing heavy packages, and a factory that
makes an `Engine` subclass declaring the spec's name and capabilities."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest
from helpers import REPO

from toolaudit import ConfigError
from toolaudit.engines import ENGINES, Engine, Registry, make_engine
from toolaudit.engines.paths import COMMON_KEYS, PathConfig, load_paths
from toolaudit.engines.registry import BUILTIN, GROUP

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_each_engine_meets_the_registry_contract(name):
    spec = ENGINES[name]
    assert spec.name == name and spec.source.startswith("the distribution toolaudit")
    assert isinstance(spec.keys, frozenset) and not spec.keys & COMMON_KEYS
    assert callable(spec.parse_options)
    factory = spec.load_factory()  # imports the engine module (torch, transformers: installed for the tests)
    assert issubclass(factory, Engine) and factory.name == name and factory.capabilities == spec.capabilities


def test_the_built_ins_register_as_pyproject_declares():
    """`registry.BUILTIN` (used only from a source tree without metadata) is what pyproject.toml declares."""
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"][GROUP]
    assert declared == BUILTIN
    installed = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=GROUP)
                 if ep.dist is not None and ep.dist.name == "toolaudit"}
    assert installed in ({}, BUILTIN)  # an editable install carries the same entry points (or none, from source)


def test_reading_paths_imports_no_engine_dependency():
    code = ("import sys\n"
            "from toolaudit.engines import ENGINES\n"
            "from toolaudit.engines.paths import load_paths\n"
            "print(sorted(ENGINES))\n"
            "load_paths('paths.example.toml')\n"
            "print(sorted(m for m in ('torch', 'transformers', 'openai', 'vllm', 'numpy') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    names, heavy = done.stdout.strip().splitlines()
    assert names == str(sorted(BUILTIN)) and heavy == "[]"


def test_an_unregistered_engine_is_a_config_error():
    with pytest.raises(ConfigError, match=r"paths.x: engine 'tgi' is not available \(available: hf, openai, torch"):
        make_engine(PathConfig(name="x", engine="tgi"))


def test_a_broken_or_foreign_entry_point_spoils_only_its_own_name(tmp_path):
    """Entry points as importlib.metadata hands them over: one whose module is missing, one naming an object
    that is not an EngineSpec; the good ones still register, and using a bad name says which entry point."""
    eps = [importlib.metadata.EntryPoint(name, value, GROUP) for name, value in (
        ("torch", BUILTIN["torch"]), ("gone", "toolaudit_no_such_module:ENGINE"),
        ("odd", "toolaudit.engines.paths:DTYPES"), ("misnamed", BUILTIN["hf"]))]
    registry = Registry(lambda: eps)
    assert list(registry) == ["torch"]
    assert set(registry.problems) == {"gone", "odd", "misnamed"}
    with pytest.raises(ConfigError) as err:
        registry.spec("gone", "paths.p")
    assert str(err.value).startswith("paths.p: engine 'gone' comes from the distribution toolaudit (entry point "
                                     "gone = toolaudit_no_such_module:ENGINE in group toolaudit.engines), which "
                                     "failed to load: ModuleNotFoundError")
    assert "is a tuple, not a toolaudit.engines.EngineSpec" in registry.problems["odd"]
    assert "whose EngineSpec is named 'hf'" in registry.problems["misnamed"]


def test_a_path_on_a_broken_engine_names_it_when_paths_toml_is_read(tmp_path, monkeypatch):
    eps = [importlib.metadata.EntryPoint("torch", BUILTIN["torch"], GROUP),
           importlib.metadata.EntryPoint("gone", "toolaudit_no_such_module:ENGINE", GROUP)]
    monkeypatch.setattr(ENGINES, "_entry_points", lambda: eps)
    ENGINES.reload()
    try:
        file = tmp_path / "paths.toml"
        file.write_text('[paths.ok]\nengine = "torch"\n\n[paths.bad]\nengine = "gone"\n')
        with pytest.raises(ConfigError, match=r"paths.toml: paths.bad: engine 'gone' comes from the distribution"):
            load_paths(file)
        file.write_text('[paths.ok]\nengine = "torch"\n')
        assert load_paths(file)["ok"].engine == "torch"
    finally:
        monkeypatch.undo()
        ENGINES.reload()
