"""The hf engine's path keys: validated without torch or transformers (config imports neither), so these run
everywhere (the one test that makes an engine skips without them). Errors name the file, the path and the key."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from toolaudit import ConfigError
from toolaudit.engines.hf import config as hconfig
from toolaudit.engines.options import defaults_of
from toolaudit.engines.paths import PathConfig, SpeculativeConfig, load_paths

NGRAM = '{ method = "ngram", num_speculative_tokens = 3 }'
DRAFT = '{ method = "draft_model", model = "smollm2-135m" }'


@pytest.mark.parametrize("body, key", [
    ('batch = "bucketed"', "batch"),
    ('attention = "flash_attention_2"', "attention"),
    ("threads = 0", "threads"),
    ("threads = true", "threads"),
    ('generate_args = "top_k=50"', "generate_args"),
    ("generate_args = { max_new_tokens = 5 }", "generate_args.max_new_tokens"),
    ("generate_args = { stop_strings = [\"x\"] }", "generate_args.stop_strings"),
    ('speculative = { method = "eagle3", model = "x" }', "speculative.method"),
    ('speculative = { method = "draft_model" }', "speculative.model"),
    ('speculative = { method = "ngram", model = "x" }', "speculative.model"),
    ('speculative = { method = "ngram", prompt_lookup_min = 2, prompt_lookup_max = 3 }',
     "speculative.prompt_lookup_min"),
    (f'batch = "padded"\nspeculative = {NGRAM}', "batch"),
    (f'batch = "padded"\nspeculative = {DRAFT}', "batch"),
    ('num_assistant_tokens_schedule = "heuristic"', "num_assistant_tokens_schedule"),
    (f'speculative = {NGRAM}\nassistant_confidence_threshold = 0.4', "assistant_confidence_threshold"),
    (f'speculative = {DRAFT}\nassistant_confidence_threshold = 1.0', "assistant_confidence_threshold"),
    (f'speculative = {DRAFT}\nnum_assistant_tokens_schedule = "fast"', "num_assistant_tokens_schedule"),
    ("numerics = \"emulated\"", "numerics"),  # a torch engine key
    ("top_k = 5\ngenerate_args = { top_k = 50 }", "generate_args.top_k"),
    ('temperature = 1.0\nbatch = "padded"\ngenerate_args = { min_p = 0.1 }', "generate_args.min_p"),
])
def test_key_errors_name_file_path_and_key(tmp_path, body, key):
    file = tmp_path / "paths.toml"
    file.write_text(f'[paths.p]\nengine = "hf"\n{body}\n')
    with pytest.raises(ConfigError) as err:
        load_paths(file)
    assert str(err.value).startswith(f"{file}: paths.p: {key} "), str(err.value)


def test_defaults_and_values(tmp_path):
    file = tmp_path / "paths.toml"
    file.write_text(f"""
[paths.plain]
engine = "hf"

[paths.harness]
engine = "hf"
batch = "padded"
batch_size = 8
attention = "eager"
threads = 1
generate_args = {{ top_k = 50, repetition_penalty = 1.1 }}

[paths.draft]
engine = "hf"
speculative = {DRAFT}
num_assistant_tokens_schedule = "heuristic"
assistant_confidence_threshold = 0.4
""")
    paths = load_paths(file)
    defaults = defaults_of(hconfig.HFOptions)
    assert paths["plain"].options == defaults  # every key stored, with its default
    harness = paths["harness"].options
    assert harness["batch"] == "padded" and harness["attention"] == "eager" and harness["threads"] == 1
    assert harness["generate_args"] == {"top_k": 50, "repetition_penalty": 1.1}
    draft = paths["draft"].options
    assert draft["num_assistant_tokens_schedule"] == "heuristic" and draft["assistant_confidence_threshold"] == 0.4
    assert hconfig.KEYS == frozenset(defaults)
    assert hconfig.ENGINE.read(paths["draft"].options).assistant_confidence_threshold == 0.4  # read typed


def test_a_path_built_in_code_is_checked_when_the_engine_is_made():
    """`dataclasses.replace` skips paths.toml validation: the engine checks the same rules (no model loads)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from toolaudit.engines import make_engine

    base = PathConfig(name="evalh", engine="hf", options={"batch": "padded"})
    make_engine(base)  # fine without speculation
    with pytest.raises(ConfigError, match=r"^paths\.evalh: batch 'padded' cannot be used with speculative"):
        make_engine(replace(base, speculative=SpeculativeConfig(method="ngram", num_speculative_tokens=3)))
    with pytest.raises(ConfigError, match=r"^paths\.evalh: speculative\.prompt_lookup_min must be 1"):
        make_engine(PathConfig(name="evalh", engine="hf",
                               speculative=SpeculativeConfig(method="ngram", prompt_lookup_min=2, prompt_lookup_max=4)))
    with pytest.raises(ConfigError, match=r"^paths\.evalh: engine 'torch' is not the hf engine"):
        from toolaudit.engines.hf.engine import HFEngine

        HFEngine(PathConfig(name="evalh"))


def test_package_import_does_not_import_torch_or_transformers():
    code = ("import sys, toolaudit.engines.hf, toolaudit.engines.hf.config; "
            "print('torch' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]
