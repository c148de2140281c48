"""The hf engine on the real SmolLM2-135M (float32, CPU) against the torch engine's target path.

generate() with transformers' sdpa attention and the torch engine's own decode loop and grouped attention are
two numerical paths: equal token for token is not asserted across engines. What is asserted: both complete,
every call that differs has its evidence (top-2 margins on both sides at the first divergence), and the
number of differing calls is reported (`-rP` or the junit property `hf_vs_torch_differ`). Needs the model
package; a few minutes on a shared 2-core CPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import short_demo_requests

pytest.importorskip("torch")
pytest.importorskip("transformers")

from toolaudit.engines import (
    make_engine,  # noqa: E402
    )
from toolaudit.engines.paths import parse_path  # noqa: E402

pytestmark = pytest.mark.slow

DEMO = Path(__file__).resolve().parents[3] / "traces" / "demo.jsonl"
CALLS = 2  # enough to show the evidence: the demo calls with the shortest prompts (each hf call ~5 s on one core)


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def test_fp32_hf_generate_vs_torch_target(model_available, record_property):
    requests = short_demo_requests(CALLS)
    common = {"model": "smollm2-135m", "dtype": "float32", "max_tokens": 40}
    target = make_engine(parse_path("target", {**common, "engine": "torch", "batch_size": CALLS}))
    hf = make_engine(parse_path("hf", {**common, "engine": "hf"}))
    try:
        a, b = target.generate(requests), hf.generate(requests)
    finally:
        hf.close()
    differ = []
    for x, y in zip(a, b):
        assert x.error is None and y.error is None, (x.error, y.error)
        assert len(y.margins) == len(y.token_ids) > 0 and y.text.startswith("<tool_call>\n")
        at = first_divergence(x.token_ids, y.token_ids)
        if at is not None:
            differ.append((x.key, at))
            assert at < len(x.margins) and at < len(y.margins), "a divergence without margins on both sides"
            print(f"{x.key}: diverges at token {at}: torch margin {x.margins[at]:.4f} top2 {x.top2[at]}, "
                  f"hf margin {y.margins[at]:.4f} top2 {y.top2[at]}")
    record_property("hf_vs_torch_differ", len(differ))
    print(f"hf generate vs torch target, float32: {len(differ)} of {CALLS} calls differ")
