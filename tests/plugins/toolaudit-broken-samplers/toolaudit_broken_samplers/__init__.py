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

from dataclasses import dataclass
from typing import Any

from toolaudit.engines import EngineSpec
from toolaudit.engines.options import key
from toolaudit.engines.torch.config import CAPABILITIES, TorchOptions
from toolaudit.engines.torch.config import check as torch_check

BUGS = ("none", "target_unwarped", "equality", "argmax", "draft_temperature")


@dataclass(frozen=True)
class BrokenOptions(TorchOptions):
    """The torch engine's keys, typed as it declares them, and the sampler defect to ship."""

    bug: str = key("none", allowed=BUGS, doc="which shipped engine's sampler defect to reproduce")


def check(options: BrokenOptions, table: dict[str, Any], fail) -> None:
    torch_check(options, table, fail)
    spec = table.get("speculative") or {}
    if options.bug == "draft_temperature" and spec.get("method") != "draft_model":
        raise fail("bug", "draft_temperature needs draft-model speculation (speculative.method = \"draft_model\")")


ENGINE = EngineSpec(name="torch-broken", factory="toolaudit_broken_samplers.engine:BrokenSamplerEngine",
                    options=BrokenOptions, check=check, store_defaults=False, capabilities=CAPABILITIES)
