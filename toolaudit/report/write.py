"""Report formats and files: which formats exist, the JSON rendering, and one file per customer and format."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolaudit.report.data import ReportError, ReportOptions, customer_report, customers_of, slugs
from toolaudit.report.html import render_html
from toolaudit.report.markdown import render_markdown
from toolaudit.report.output import to_json
from toolaudit.report.remedies import remedies_report, render_remedies_html, render_remedies_markdown
from toolaudit.store import Store


def render_json(report: dict) -> str:
    return to_json(report) + "\n"


RENDERERS: dict[str, Callable[[dict], str]] = {"html": render_html, "md": render_markdown, "json": render_json}
MATRIX_RENDERERS: dict[str, Callable[[dict], str]] = {"html": render_remedies_html, "md": render_remedies_markdown,
                                                      "json": render_json}
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


@dataclass(frozen=True)
class Written:
    """One report file, with what `report --json` says about it: a customer's headline figures, or for a
    matrix's remedy report the recommendation."""

    path: Path
    run_id: int
    customer: str
    kind: str  # "customer" | "remedies"
    candidate: str | None
    headline: dict[str, Any] | None = None
    recommendation: dict[str, Any] | None = None


def write_reports(store: Store, run_id: int | None, customers: Sequence[str] | None, formats: Sequence[str],
                  out_dir: str | Path, options: ReportOptions | None = None) -> list[Path]:
    """Write one file per customer and format under out_dir/run-<id>/; customers=None means all.

    For a matrix run: each candidate's reports under its own run folder, and under the matrix's folder one
    remedy report per customer and format that links to them."""
    return [w.path for w in write_reports_detailed(store, run_id, customers, formats, out_dir, options)]


def write_reports_detailed(store: Store, run_id: int | None, customers: Sequence[str] | None,
                           formats: Sequence[str], out_dir: str | Path,
                           options: ReportOptions | None = None) -> list[Written]:
    """`write_reports`, each file with the figures it headlines."""
    run = store.run_row(run_id)
    if run["kind"] == "matrix":
        return _write_matrix_reports(store, run, customers, formats, out_dir, options)
    rid = run["run_id"]
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
            written.append(Written(path, rid, customer, "customer", run["candidate_name"], report["headline"]))
    return written


def _write_matrix_reports(store: Store, run: dict, customers: Sequence[str] | None, formats: Sequence[str],
                          out_dir: str | Path, options: ReportOptions | None) -> list[Written]:
    members = store.matrix_members(run["run_id"])
    members_customers = {m["run_id"]: customers_of(store, m["run_id"]) for m in members}
    known = sorted({c for cs in members_customers.values() for c in cs})
    wanted = list(known) if customers is None else list(dict.fromkeys(customers))
    missing = [c for c in wanted if c not in known]
    if missing:
        raise ReportError(f"matrix run {run['run_id']} has no calls for customer {missing[0]!r} "
                          f"(see `toolaudit frontier --run {run['run_id']}`)")
    written: list[Written] = []
    member_slugs = {}
    for m in members:
        member_slugs[m["run_id"]] = slugs(members_customers[m["run_id"]])
        mine = [c for c in wanted if c in member_slugs[m["run_id"]]]
        if mine:
            written += write_reports_detailed(store, m["run_id"], mine, formats, out_dir, options)
    names = slugs(known)
    folder = Path(out_dir) / f"run-{run['run_id']}"
    folder.mkdir(parents=True, exist_ok=True)
    for customer in wanted:
        stems = {m["candidate_name"]: f"../run-{m['run_id']}/{member_slugs[m['run_id']][customer]}"
                 for m in members if customer in member_slugs[m["run_id"]]}
        report = remedies_report(store, run["run_id"], customer, options)
        for fmt in formats:  # the same report in each format, linking the candidates' reports of that format
            for candidate in report["candidates"]:
                stem = stems.get(candidate["candidate"])
                candidate["report"] = f"{stem}.{fmt}" if stem else None
            path = folder / f"{names[customer]}.{fmt}"
            path.write_text(MATRIX_RENDERERS[fmt](report), encoding="utf-8")
            written.append(Written(path, run["run_id"], customer, "remedies", None,
                                   recommendation=report["frontier"]["recommendation"]))
    return written


def written_json(run: dict, written: Sequence[Written], frontiers: dict[str, Any] | None = None) -> dict[str, Any]:
    """What `report --json` prints: the files written and, per customer (per candidate run for a matrix), the
    report's headline figures; for a matrix, each customer's recommendation and the frontiers `report` prints."""
    customers: dict[tuple[int, str], dict[str, Any]] = {}
    remedies: dict[str, dict[str, Any]] = {}
    for w in written:
        if w.kind == "remedies":
            entry = remedies.setdefault(w.customer, {"customer": w.customer, "files": [],
                                                     "recommendation": w.recommendation})
        else:
            entry = customers.setdefault((w.run_id, w.customer), {
                "customer": w.customer, "run_id": w.run_id, "candidate": w.candidate, "files": [],
                "headline": w.headline})
        entry["files"].append(str(w.path))
    return {"run_id": run["run_id"], "kind": run["kind"], "files": [str(w.path) for w in written],
            "customers": list(customers.values()), "remedies": list(remedies.values()) if remedies else None,
            "frontier": frontiers}
