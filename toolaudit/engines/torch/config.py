"""The torch engine's part of a `[paths.NAME]` table. It has no keys of its own: model, dtype, device, batch
size, sampling, speculative, prompt and prefix caching are common keys (`toolaudit.engines.paths`). What is
its own is which speculative methods it runs. No heavy imports: paths.toml is read before any engine loads.
"""

from __future__ import annotations

from typing import Any, Callable

from ...errors import ConfigError

KEYS: frozenset[str] = frozenset()
SPEC_METHODS = ("ngram", "draft_model")


def parse_options(table: dict[str, Any], fail: Callable[[str, str], ConfigError]) -> dict[str, Any]:
    """Check the speculative method (common parsing checked the rest of the table); no options to return."""
    spec = table.get("speculative")
    if spec is not None:
        method, model = spec.get("method"), spec.get("model")
        if method not in SPEC_METHODS:
            raise fail("speculative.method", f"must be one of {', '.join(SPEC_METHODS)}")
        if method == "draft_model":
            if not isinstance(model, str) or not model:
                raise fail("speculative.model", "is required for method draft_model (a model sharing the tokenizer)")
        elif model is not None:
            raise fail("speculative.model", "is only used with method draft_model")
    return {}
