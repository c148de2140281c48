"""Report formats and files: which formats exist, the JSON rendering, and one file per customer and format."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from toolaudit.output import to_json
from toolaudit.report.data import ReportError, ReportOptions, customer_report, customers_of, slugs
from toolaudit.report.html import render_html
from toolaudit.report.markdown import render_markdown
from toolaudit.store import Store


def render_json(report: dict) -> str:
    return to_json(report) + "\n"


RENDERERS: dict[str, Callable[[dict], str]] = {"html": render_html, "md": render_markdown, "json": render_json}
FORMATS = tuple(RENDERERS)  # html, md, json: also the order files are written in when none are named


def parse_formats(values: Iterable[str]) -> list[str]:
    """`("html,md", "json")` -> ["html", "md", "json"]; empty -> all three."""
    wanted: list[str] = []
    for value in values:
        for part in value.split(","):
            name = part.strip().lower()
            name = "md" if name == "markdown" else name
            if not name:
                continue
            if name not in FORMATS:
                raise ReportError(f"unknown format {part.strip()!r}; use html, md or json")
            if name not in wanted:
                wanted.append(name)
    return wanted or list(FORMATS)


def write_reports(store: Store, run_id: int | None, customers: Sequence[str] | None, formats: Sequence[str],
                  out_dir: str | Path, options: ReportOptions | None = None) -> list[Path]:
    """Write one file per customer and format under out_dir/run-<id>/; customers=None means all."""
    rid = store.run_row(run_id)["run_id"]
    known = customers_of(store, rid)
    wanted = list(known) if customers is None else list(dict.fromkeys(customers))
    missing = [c for c in wanted if c not in known]
    if missing:
        raise ReportError(f"run {rid} has no calls for customer {missing[0]!r} "
                          f"(see `toolaudit summary --run {rid}`)")
    if not wanted:
        raise ReportError(f"run {rid} has no calls to report on")
    names = slugs(known)
    folder = Path(out_dir) / f"run-{rid}"
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for customer in wanted:
        report = customer_report(store, rid, customer, options)
        for fmt in formats:
            path = folder / f"{names[customer]}.{fmt}"
            path.write_text(RENDERERS[fmt](report), encoding="utf-8")
            written.append(path)
    return written
