"""The floor block in every view: a candidate beside its noise floor, and its excess over it (paired by call, with
a 95% interval), as the terminal, the remedy tables, the Markdown and HTML reports and their shared text show it.

The one place that reads the floor figures' keys for display (`analysis/floor.py` writes them) and words the
excess: the renderers lay out the columns, cells, lines and cards made here, formatted by `numbers.py`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toolaudit.report.numbers import interval, pct, points, signed_points, span

TOOL_COLUMNS = ["floor (95% CI)", "excess (95% CI)"]  # a run's per-tool table beside its floor
CUSTOMER_COLUMNS = ["floor", "excess (95% CI)"]  # a run's per-customer table
REMEDY_COLUMN = "beyond the floor (95% CI)"  # a frontier's candidate table, when its matrix has a floor


@dataclass(frozen=True)
class Excess:
    """The excess as a view reads it, wherever it came from (a nested summary, a flat row, a remedy's figures)."""

    estimate: float
    low: float | None
    high: float | None

    @staticmethod
    def nested(f: dict[str, Any]) -> Excess:
        """From `summary --json`'s `noise_floor` (`FloorFigures.as_dict`)."""
        e = f["excess"]
        return Excess(e["estimate"], e["low"], e["high"])

    @staticmethod
    def flat(row: dict[str, Any]) -> Excess | None:
        """From a flat row (`floor.paired_keys`: a tool's, a customer's, a report's `noise_floor`); None without."""
        if row.get("excess") is None:
            return None
        return Excess(row["excess"], row["excess_ci_low"], row["excess_ci_high"])

    @property
    def cell(self) -> str:
        """`+4.72pp (-2.58pp to +11.84pp)`: a table cell."""
        return f"{signed_points(self.estimate)} ({span(self.low, self.high)})"


def floor_lines(f: dict | None, sampled: bool = False) -> list[str]:
    """The summary screen's floor lines: the floor (the baseline decoded again with other batch neighbours; at
    temperature > 0 with other seeds too), then the candidate beyond it."""
    if not f:
        return []
    floor, ex = f["floor"], Excess.nested(f)
    how = "other batch neighbours and other seeds" if sampled else "other batch neighbours"
    return [
        f"  noise floor           {floor['drifted_calls']} ({pct(floor['drift_rate'])}, 95% CI "
        f"{pct(floor['ci_low'])}-{pct(floor['ci_high'])}, {points(floor['ci_width'])} wide): {f['floor_path']}, "
        f"the baseline path with {how} (run {f['floor_run_id']})",
        f"  beyond the floor      {signed_points(ex.estimate)} ({interval(ex.low, ex.high, signed_points)}), "
        f"paired on {f['calls']} calls: {f['only_candidate']} drifted on the candidate only, "
        f"{f['only_floor']} on the floor only, {f['both']} on both",
    ]


def floor_verdict(f: dict) -> str:
    """What the candidate's drift is beside its floor, in words (the summary's verdict, after the candidate)."""
    ex = Excess.nested(f)
    if ex.low > 0:
        return "its drift is beyond batching noise (the excess's 95% CI is above 0)"
    if ex.high < 0:
        return ("its drift is below the noise floor (the excess's 95% CI is below 0): none of it is beyond batching "
                "noise")
    return "its drift is within batching noise (the excess's 95% CI contains 0; more calls narrow it)"


def tool_cells(t: dict[str, Any]) -> list[str]:
    """A tool's row under TOOL_COLUMNS."""
    return [f"{pct(t['floor_drift_rate'])} ({pct(t['floor_ci_low'])}-{pct(t['floor_ci_high'])})",
            Excess.flat(t).cell]


def customer_cells(c: dict[str, Any]) -> list[str]:
    """A customer's row under CUSTOMER_COLUMNS ("-" where no call of the customer is paired with the floor)."""
    if c.get("floor_drift_rate") is None:
        return ["-", "-"]
    return [pct(c["floor_drift_rate"]), Excess.flat(c).cell]


def remedy_cells(figures) -> list[str]:
    """A candidate's cell under REMEDY_COLUMN, from its `FloorFigures` (None: no call paired with the floor)."""
    if figures is None:
        return ["-"]
    e = figures.excess
    return [Excess(e.estimate, e.low, e.high).cell]


def report_sentences(nf: dict[str, Any] | None) -> list[str]:
    """The reports' headline sentences on a customer's floor (`text.headline_sentences`): the floor, and the
    candidate beyond it when paired with it."""
    if not nf:
        return []
    floor = (f"Noise floor (run {nf['run_id']}, {nf['path_name']} against itself): {pct(nf['drift_rate'])} of "
             f"{nf['calls']:,} calls drifted (95% CI {pct(nf['ci_low'])} to {pct(nf['ci_high'])}).")
    ex = Excess.flat(nf)
    if ex is None:
        return [floor]
    return [floor, f"Beyond the floor, paired by call: {signed_points(ex.estimate, unit=' points')} (95% CI "
            f"{span(ex.low, ex.high, lambda x: signed_points(x, unit=''))}); {nf['only_candidate']} calls drifted on "
            f"the candidate only, {nf['only_floor']} on the floor only."]


def markdown_lines(nf: dict[str, Any] | None) -> list[str]:
    """The Markdown report's paragraphs under its decode paths: the candidate beyond its floor, then the floor (or
    that no floor covers the customer)."""
    if not nf:
        return ["No noise-floor run covers this customer: replay with --noise-floor (the baseline decoded again with "
                "other batch neighbours) to separate batching noise from the candidate's drift."]
    ex = Excess.flat(nf)
    beyond = [] if ex is None else [
        f"Drift beyond the noise floor, paired by call: {signed_points(ex.estimate, unit=' points')} "
        f"({interval(ex.low, ex.high, signed_points)}); {nf['only_candidate']} calls drifted on the candidate only, "
        f"{nf['only_floor']} on the floor only, {nf['both']} on both (not the candidate's doing)."]
    return [*beyond, f"Noise floor: {pct(nf['drift_rate'])}, 95% CI {pct(nf['ci_low'])} to {pct(nf['ci_high'])} "
                     f"({points(nf['ci_width'], unit=' points')} wide)."]


def html_cards(nf: dict[str, Any] | None) -> list[tuple[str, str, str]]:
    """The HTML report's floor cards (label, value, detail; unescaped): the floor, and the candidate beyond it."""
    if not nf:
        return [("Noise floor", "n/a", "no noise-floor run for this customer")]
    cards = [("Noise floor", pct(nf["drift_rate"]),
              f"run {nf['run_id']} · {nf['calls']:,} calls · same path twice · 95% CI "
              f"{pct(nf['ci_low'])}–{pct(nf['ci_high'])} ({points(nf['ci_width'], unit=' pts')} wide)")]
    ex = Excess.flat(nf)
    if ex is not None:
        cards.append(("Beyond the floor", signed_points(ex.estimate, unit=" pts"),
                      f"paired by call · {interval(ex.low, ex.high, signed_points)} · {nf['only_candidate']:,} calls "
                      "on the candidate only"))
    return cards
