"""Run-wide overrides (`replay --numerics`, `demo --numerics`) reach every path whose engine declares the key in
its capabilities, by that declaration and not by engine name, validated by that engine as paths.toml would be;
an override no path takes is an error. No model loads here."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from helpers import DEMO, openai_path_toml

from toolaudit import ConfigError
from toolaudit.cli import cli
from toolaudit.engines import ENGINES
from toolaudit.replay.inputs import ReplayOptions, resolve_paths

PATHS = ('[paths.t-bf16]\nengine = "torch"\ndtype = "bfloat16"\nnumerics = "native"\nthreads = 1\n\n'
         '[paths.t-fp32]\nengine = "torch"\ndtype = "float32"\n\n'
         '[paths.h-bf16]\nengine = "hf"\ndtype = "bfloat16"\n'
         + openai_path_toml("remote", "http://127.0.0.1:9/v1", "m"))


def resolved(tmp_path, baseline: str, candidates: list[str], numerics: str | None):
    file = tmp_path / "paths.toml"
    file.write_text(PATHS)
    options = ReplayOptions(traces=[str(DEMO)], baseline=baseline, candidate=candidates[0],
                            candidates=candidates if len(candidates) > 1 else None, paths_file=str(file),
                            numerics=numerics)
    base, others = resolve_paths(options)
    return {p.name: p for p in (base, *others)}


def test_numerics_reaches_the_engines_that_declare_it(tmp_path):
    assert [name for name, spec in ENGINES.items() if "numerics" in spec.capabilities.overrides] == ["torch"]
    paths = resolved(tmp_path, "t-bf16", ["h-bf16", "remote"], "emulated")
    assert paths["t-bf16"].options == {"numerics": "emulated", "threads": 1}  # the path's other keys kept
    assert paths["h-bf16"].options == resolved(tmp_path, "t-bf16", ["h-bf16", "remote"], None)["h-bf16"].options
    assert "numerics" not in paths["remote"].options


def test_an_override_is_validated_by_the_engine_and_must_reach_a_path(tmp_path):
    with pytest.raises(ConfigError, match=r"^paths\.t-bf16: numerics must be one of auto, native, emulated "
                                          r"\(got 'fast'\) \(a run-wide override\)$"):
        resolved(tmp_path, "t-bf16", ["remote"], "fast")
    with pytest.raises(ConfigError, match=r"^paths\.t-fp32: numerics 'emulated' applies to bfloat16 and float16 "
                                          r"only \(dtype is float32\)"):
        resolved(tmp_path, "t-bf16", ["t-fp32"], "emulated")
    assert resolved(tmp_path, "t-bf16", ["t-fp32"], "native")["t-fp32"].options == {"numerics": "native"}
    with pytest.raises(ConfigError, match=r"^numerics: no path of this run accepts it \(engines that do: torch; "
                                          r"the paths' engines: hf, openai\)$"):
        resolved(tmp_path, "h-bf16", ["remote"], "native")


def test_replay_cli_numerics_option(tmp_path):
    file = tmp_path / "paths.toml"
    file.write_text(PATHS)
    result = CliRunner().invoke(cli, ["replay", str(DEMO), "--paths", str(file), "--baseline", "h-bf16",
                                      "--candidate", "remote", "--numerics", "emulated", "--db",
                                      str(tmp_path / "x.duckdb")])
    assert result.exit_code == 2 and "numerics: no path of this run accepts it" in result.output
    result = CliRunner().invoke(cli, ["replay", "--resume", "1", "--numerics", "native", "--db",
                                      str(tmp_path / "x.duckdb")])
    assert result.exit_code == 2 and "do not pass trace files, --collected, --numerics, --max-tokens, --temperature" \
        in result.output


def test_max_tokens_reaches_every_path_whatever_its_engine(tmp_path):
    """`replay --max-tokens` / `demo --max-tokens`: a common key, set on every path (an answer cut there is
    truncated, not compared), and part of each path's config (its fingerprint)."""
    file = tmp_path / "paths.toml"
    file.write_text(PATHS)
    options = ReplayOptions(traces=[str(DEMO)], baseline="t-bf16", candidate="h-bf16", candidates=["h-bf16", "remote"],
                            paths_file=str(file), max_tokens=192)
    base, others = resolve_paths(options)
    assert [p.max_tokens for p in (base, *others)] == [192, 192, 192]
    assert base.config_dict()["max_tokens"] == 192 and base.options == {"numerics": "native", "threads": 1}
    assert resolve_paths(ReplayOptions(traces=[str(DEMO)], baseline="t-bf16", candidate="remote",
                                       paths_file=str(file)))[0].max_tokens == 96
