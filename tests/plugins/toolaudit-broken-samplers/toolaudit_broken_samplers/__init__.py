"""The `torch-broken` engine's registration: the torch engine's keys plus `bug`, the sampler it ships.

`bug` (each a shipped engine's real defect, reproduced on the embedded engine's speculative sampler):
- `none`: the correct rejection sampler (through the plug-in: it must not be flagged);
- `target_unwarped` (vLLM #10198): the target's probabilities in rejection sampling ignore the request's
  temperature, top-k and top-p;
- `equality` (mlx-swift-lm #459): a proposal is accepted when it equals one sample of the target, and a rejected
  position draws afresh from the target (so proposals are over-accepted: the modes both models share win);
- `argmax` (mistral.rs #2424): the speculative path returns the argmax instead of sampling;
- `draft_temperature` (dflash #74; DeepSpec #31 is of its kind): the draft proposes greedily while the
  acceptance ratio assumes it sampled at the request's temperature and top-p (needs draft-model speculation).
"""

from __future__ import annotations

from typing import Any, Callable

from toolaudit.engines import EngineSpec
from toolaudit.engines.torch.config import CAPABILITIES
from toolaudit.engines.torch.config import KEYS as TORCH_KEYS
from toolaudit.engines.torch.config import parse_options as torch_options

BUGS = ("none", "target_unwarped", "equality", "argmax", "draft_temperature")


def parse_options(table: dict[str, Any], fail: Callable[[str, str], Exception]) -> dict[str, Any]:
    options = torch_options({k: v for k, v in table.items() if k != "bug"}, fail)
    bug = table.get("bug", "none")
    if bug not in BUGS:
        raise fail("bug", f"must be one of {', '.join(BUGS)} (got {bug!r})")
    spec = table.get("speculative") or {}
    if bug == "draft_temperature" and spec.get("method") != "draft_model":
        raise fail("bug", "draft_temperature needs draft-model speculation (speculative.method = \"draft_model\")")
    options["bug"] = bug
    return options


ENGINE = EngineSpec(name="torch-broken", factory="toolaudit_broken_samplers.engine:BrokenSamplerEngine",
                    keys=TORCH_KEYS | {"bug"}, parse_options=parse_options, capabilities=CAPABILITIES)
