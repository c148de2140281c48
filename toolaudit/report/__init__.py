"""The rendering home: every view of the figures (the terminal's screens, the per-customer reports in HTML,
Markdown and JSON, the history page) and the one module that writes numbers (`numbers`).

`numbers` formats rates, points, p-values and intervals for every view; `output` prints tables, JSON and CSV;
`terminal` and `terminal_sampled` are the terminal's summary screen, `terminal_remedies` its frontier tables;
`data` builds one customer's report as a plain dict (every figure filtered to that customer's calls);
`markdown` and `html` render it, sharing the sentences in `text`; `write` knows the formats and writes the
files; `history` is the page of runs over time (`history --html`). Nothing here computes a figure: the analysis
package does. This package imports nothing on import (its names load on first use), so `numbers` can be used
anywhere without import cycles.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "ReportError": "data", "ReportOptions": "data", "customer_report": "data", "customers_of": "data",
    "is_noise_floor": "data", "slugs": "data", "render_html": "html", "render_markdown": "markdown",
    "FORMATS": "write", "Written": "write", "parse_formats": "write", "render_json": "write",
    "write_reports": "write", "write_reports_detailed": "write",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
