"""paths.toml parsing: built-ins, overrides, and errors that name the file, the path and the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolaudit import ConfigError
from toolaudit.engines.paths import PathConfig, PromptConfig, SpeculativeConfig, builtin_paths, load_paths

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    file = tmp_path / "paths.toml"
    file.write_text(text)
    return file


def test_builtins_differ_only_in_speculation():
    paths = load_paths(None)
    assert set(paths) == {"target", "spec-ngram", "spec-ngram-k3", "spec-ngram-fp32", "target-fp32", "spec-draft",
                          "target-invariant", "spec-ngram-invariant"}
    target, spec = paths["target"], paths["spec-ngram"]
    assert target.speculative is None and target.dtype == "bfloat16" and target.temperature == 0
    assert spec.speculative == SpeculativeConfig(method="ngram", num_speculative_tokens=5, prompt_lookup_min=1,
                                                 prompt_lookup_max=4)
    a, b = target.config_dict(), spec.config_dict()
    assert {k for k in a if a[k] != b[k]} == {"speculative"}
    assert a["prompt"] == {"few_shot": 2, "prefill": "<tool_call>\n"}
    assert a["stop"] == ["</tool_call>"]
    json.dumps(a)
    # the remedies differ from spec-ngram in one key each, and target-fp32 from target in dtype only
    for name, key in (("spec-ngram-k3", "speculative"), ("spec-ngram-fp32", "dtype")):
        c = paths[name].config_dict()
        assert {k for k in b if b[k] != c[k]} == {key}, name
    assert paths["spec-ngram-k3"].speculative.num_speculative_tokens == 3
    t32 = paths["target-fp32"].config_dict()
    assert {k for k in a if a[k] != t32[k]} == {"dtype"} and t32["dtype"] == "float32"
    draft = paths["spec-draft"].config_dict()  # the target's own first layers as the draft model
    assert {k for k in a if a[k] != draft[k]} == {"speculative"}
    assert paths["spec-draft"].speculative == SpeculativeConfig(method="draft_model", num_speculative_tokens=3,
                                                                model="smollm2-135m:first8")


def test_file_adds_and_overrides(tmp_path):
    file = write(tmp_path, """
[paths.target]
dtype = "float32"
batch_size = 2

[paths.spec]
model = "some/dir"
temperature = 0.7
seed = 3
stop = "</call>"
speculative = { method = "draft_model", model = "smollm2-135m", num_speculative_tokens = 3 }

[paths.spec.prompt]
few_shot = false
prefill = ""

[paths.remote]
engine = "openai"
base_url = "http://localhost:8000/v1"
""")
    paths = load_paths(file)
    assert set(paths) == {"target", "spec-ngram", "spec-ngram-k3", "spec-ngram-fp32", "target-fp32", "spec-draft",
                          "target-invariant", "spec-ngram-invariant", "spec", "remote"}
    assert paths["target"].dtype == "float32" and paths["target"].batch_size == 2
    spec = paths["spec"]
    assert spec.speculative.method == "draft_model" and spec.speculative.model == "smollm2-135m"
    assert spec.speculative.num_speculative_tokens == 3
    assert spec.prompt == PromptConfig(few_shot=0, prefill="")
    assert spec.stop_strings == ("</call>",) and spec.temperature == 0.7 and spec.seed == 3
    assert paths["remote"].options == {"base_url": "http://localhost:8000/v1"}
    assert PathConfig(name="x", prompt=PromptConfig(prefill="")).stop_strings == ()


@pytest.mark.parametrize("body, message", [
    ('[paths.spec]\nspeculative = { method = "eagle" }',
     "paths.toml: paths.spec: speculative.method must be one of ngram, draft_model"),
    ('[paths.spec]\nspeculative = { method = "draft_model" }',
     "paths.toml: paths.spec: speculative.model is required for method draft_model"),
    ('[paths.spec]\nspeculative = { method = "ngram", num_speculative_tokens = 0 }',
     "paths.toml: paths.spec: speculative.num_speculative_tokens must be a positive integer (got 0)"),
    ('[paths.spec]\nspeculative = { method = "ngram", prompt_lookup_min = 5, prompt_lookup_max = 2 }',
     "paths.toml: paths.spec: speculative.prompt_lookup_min must be <= prompt_lookup_max (5 > 2)"),
    ('[paths.spec]\nspeculative = { method = "ngram", lookahead = 2 }',
     "paths.toml: paths.spec: speculative.lookahead is not a known key"),
    ('[paths.p]\ndtype = "int8"',
     "paths.toml: paths.p: dtype must be one of float32, bfloat16, float16, float64 (got 'int8')"),
    ('[paths.p]\ndevice = "tpu"', "paths.toml: paths.p: device must be cpu, cuda or cuda:N (got 'tpu')"),
    ('[paths.p]\nbatch_size = "8"', "paths.toml: paths.p: batch_size must be a positive integer (got '8')"),
    ('[paths.p]\nmax_tokens = true', "paths.toml: paths.p: max_tokens must be a positive integer (got True)"),
    ('[paths.p]\ntemperature = -1', "paths.toml: paths.p: temperature must be >= 0"),
    ('[paths.p]\nengine = "tgi"', "paths.toml: paths.p: engine must be one of hf, openai, torch, vllm (got 'tgi')"),
    ('[paths.p]\nmax_token = 5', "paths.toml: paths.p: max_token is not a key the torch engine knows"),
    ('[paths.p]\nprefix_caching = "yes"', "paths.toml: paths.p: prefix_caching must be a boolean"),
    ('[paths.p.prompt]\nfew_shot = 5',
     "paths.toml: paths.p: prompt.few_shot must be true, false or a count from 0 to 2"),
    ('[paths.p.prompt]\nprefill = 1', "paths.toml: paths.p: prompt.prefill must be a string"),
    ('[paths.p]\nstop = [""]', "paths.toml: paths.p: stop must be a string or a list of non-empty strings"),
    ("[paths]\np = 3", "paths.toml: paths.p: must be a table"),
    ("[decoders.p]\nx = 1", "paths.toml: unknown top-level table(s) decoders"),
    ("[paths.p\n", "paths.toml: not valid TOML"),
])
def test_errors_name_file_path_and_key(tmp_path, body, message):
    with pytest.raises(ConfigError) as info:
        load_paths(write(tmp_path, body))
    assert message in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="nope.toml: file not found"):
        load_paths(tmp_path / "nope.toml")


def test_example_file_documents_every_key():
    text = (ROOT / "paths.example.toml").read_text()
    paths = load_paths(ROOT / "paths.example.toml")
    assert paths["target"] == builtin_paths()["target"]  # the example shows the built-in values
    assert paths["spec-ngram"] == builtin_paths()["spec-ngram"]
    assert paths["spec-draft"] == builtin_paths()["spec-draft"]
    assert paths["spec-self-draft"].speculative.model == "smollm2-135m"
    keys = ["engine", "model", "dtype", "device", "batch_size", "max_tokens", "temperature", "seed", "stop",
            "prefix_caching", "speculative", "method", "num_speculative_tokens", "prompt_lookup_min",
            "prompt_lookup_max", "few_shot", "prefill"]
    assert [k for k in keys if k not in text] == []
