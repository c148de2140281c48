"""Per-customer drift reports (HTML, Markdown, JSON) built from one run.

`data` builds one customer's report as a plain dict (every figure filtered to that customer's calls);
`markdown` and `html` render it, sharing the sentences in `text`; `write` knows the formats and writes the
files; `history` is the page of runs over time (`report --history`). Import order runs one way only: data <- text
<- markdown, html (<- charts) <- write <- this package; history imports data, html and charts, and nothing here
imports it.
"""

from toolaudit.report.data import ReportError, ReportOptions, customer_report, customers_of, is_noise_floor, slugs
from toolaudit.report.html import render_html
from toolaudit.report.markdown import render_markdown
from toolaudit.report.write import FORMATS, Written, parse_formats, render_json, write_reports, write_reports_detailed

__all__ = [
    "FORMATS",
    "ReportError",
    "ReportOptions",
    "Written",
    "customer_report",
    "customers_of",
    "is_noise_floor",
    "parse_formats",
    "render_html",
    "render_json",
    "render_markdown",
    "slugs",
    "write_reports",
    "write_reports_detailed",
]
