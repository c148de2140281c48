"""Small inline SVG charts for reports: no JavaScript, no external assets, every label escaped.

Each function returns one `<svg>` element sized by its viewBox (it scales to the page width) with a
`<title>` for screen readers.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

INK = "#1f2937"
MUTED = "#6b7280"
GRID = "#e5e7eb"
BLUE = "#2563eb"
BAND = "#bfdbfe"
AMBER = "#d97706"
SLATE = "#94a3b8"
FONT = "font-family=\"system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif\""


def nice_max(value: float) -> float:
    """The smallest 1, 2, 2.5 or 5 times a power of ten that is >= value (axis tops)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * power >= value * (1 - 1e-9):
            return step * power
    return 10 * power  # pragma: no cover


def percent_label(value: float) -> str:
    return f"{100 * value:.3g}%"  # axis ticks are round numbers: 0.25%, 1.25%, 12.5%, 100%


def _svg(width: int, height: int, title: str, body: list[str]) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" role="img" '
            f'class="chart" {FONT} font-size="12">'
            f"<title>{escape(title)}</title>" + "".join(body) + "</svg>")


def _text(x: float, y: float, text: str, anchor: str = "middle", fill: str = MUTED, extra: str = "") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" fill="{fill}"{extra}>'
            f"{escape(text)}</text>")


@dataclass(frozen=True)
class Frame:
    """Plot area inside the SVG, with the margins that hold the axis labels."""

    width: int = 720
    height: int = 280
    left: int = 64
    right: int = 20
    top: int = 20
    bottom: int = 48

    @property
    def plot_w(self) -> float:
        return self.width - self.left - self.right

    @property
    def plot_h(self) -> float:
        return self.height - self.top - self.bottom

    def y_axis(self, top_value: float, label: Callable[[float], str], ticks: int = 4) -> list[str]:
        parts = []
        for i in range(ticks + 1):
            value = top_value * i / ticks
            y = self.top + self.plot_h * (1 - i / ticks)
            parts.append(f'<line x1="{self.left}" x2="{self.left + self.plot_w:.1f}" y1="{y:.1f}" '
                         f'y2="{y:.1f}" stroke="{GRID}"/>')
            parts.append(_text(self.left - 8, y + 4, label(value), "end"))
        return parts

    def axis_titles(self, x_title: str, y_title: str) -> list[str]:
        cy = self.top + self.plot_h / 2
        return [_text(self.left + self.plot_w / 2, self.height - 8, x_title, fill=INK),
                _text(14, cy, y_title, fill=INK, extra=f' transform="rotate(-90 14 {cy:.1f})"')]


def session_drift_chart(rows: Sequence[tuple[int, float, float, float]], observed: tuple[float, float] | None,
                        title: str) -> str:
    """Expected share of sessions with drift vs session length: (calls, p, low, high) rows, a 95% band,
    and optionally the observed (mean calls per session, observed share) point."""
    f = Frame(height=300, top=40)
    peak = max([r[3] for r in rows] + ([observed[1]] if observed else []) + [1e-6])
    top = nice_max(peak)
    n_max = max(r[0] for r in rows)

    def x(n: float) -> float:
        return f.left + f.plot_w * (n - 1) / max(n_max - 1, 1)

    def y(v: float) -> float:
        return f.top + f.plot_h * (1 - min(v, top) / top)

    body = f.y_axis(top, percent_label)
    band = [f"{x(n):.1f},{y(hi):.1f}" for n, _, _, hi in rows] + [
        f"{x(n):.1f},{y(lo):.1f}" for n, _, lo, _ in reversed(rows)]
    body.append(f'<polygon points="{" ".join(band)}" fill="{BAND}" fill-opacity="0.6" stroke="none"/>')
    line = " ".join(f"{x(n):.1f},{y(p):.1f}" for n, p, _, _ in rows)
    body.append(f'<polyline points="{line}" fill="none" stroke="{BLUE}" stroke-width="2.5"/>')
    for n, p, _, _ in rows:
        body.append(f'<circle cx="{x(n):.1f}" cy="{y(p):.1f}" r="3" fill="{BLUE}"/>')
        body.append(_text(x(n), f.top + f.plot_h + 18, str(n)))
    if observed is not None and 1 <= observed[0] <= n_max:
        ox, oy = x(observed[0]), y(observed[1])
        body.append(f'<rect x="{ox - 5:.1f}" y="{oy - 5:.1f}" width="10" height="10" fill="{AMBER}" '
                    f'transform="rotate(45 {ox:.1f} {oy:.1f})"/>')
    legend_y = 8
    body += [f'<rect x="{f.left + 12}" y="{legend_y}" width="14" height="10" fill="{BAND}"/>',
             (f'<line x1="{f.left + 12}" x2="{f.left + 26}" y1="{legend_y + 5}" y2="{legend_y + 5}" '
             f'stroke="{BLUE}" stroke-width="2.5"/>'),
             _text(f.left + 32, legend_y + 9, "expected (95% CI band)", "start", INK)]
    if observed is not None:
        body += [(f'<rect x="{f.left + 200}" y="{legend_y}" width="9" height="9" fill="{AMBER}" '
                 f'transform="rotate(45 {f.left + 204.5} {legend_y + 4.5})"/>'),
                 _text(f.left + 216, legend_y + 9, "observed (mean session length)", "start", INK)]
    body += f.axis_titles("calls per session", "sessions with any drift")
    return _svg(f.width, f.height, title, body)


def histogram(bins: Sequence[tuple[str, int, bool]], title: str, x_title: str,
              highlight_label: str, other_label: str) -> str:
    """Bars of (label, count, highlighted); highlighted bars in grey-blue, the others in amber."""
    f = Frame(height=300, top=40, bottom=56)
    top = nice_max(max([b[1] for b in bins] + [1]))
    if top < 4:
        top = 4.0
    slot = f.plot_w / max(len(bins), 1)

    def count_label(v: float) -> str:
        return f"{v:g}"

    body = f.y_axis(top, count_label)
    for i, (label, count, highlighted) in enumerate(bins):
        h = f.plot_h * count / top
        x0 = f.left + i * slot + slot * 0.12
        fill = SLATE if highlighted else AMBER
        body.append(f'<rect x="{x0:.1f}" y="{f.top + f.plot_h - h:.1f}" width="{slot * 0.76:.1f}" '
                    f'height="{h:.1f}" fill="{fill}" rx="2"/>')
        if count:
            body.append(_text(x0 + slot * 0.38, f.top + f.plot_h - h - 5, str(count), fill=INK))
        body.append(_text(f.left + (i + 0.5) * slot, f.top + f.plot_h + 18, label))
    ly = 8
    body += [f'<rect x="{f.left + f.plot_w - 300}" y="{ly}" width="12" height="10" fill="{SLATE}"/>',
             _text(f.left + f.plot_w - 283, ly + 9, highlight_label, "start", INK),
             f'<rect x="{f.left + f.plot_w - 150}" y="{ly}" width="12" height="10" fill="{AMBER}"/>',
             _text(f.left + f.plot_w - 133, ly + 9, other_label, "start", INK)]
    body += f.axis_titles(x_title, "drifted calls")
    return _svg(f.width, f.height, title, body)


def interval_chart(rows: Sequence[tuple[str, float, float, float]], title: str,
                   budget: float | None = None) -> str:
    """One row per label: point estimate with its 95% interval as a whisker; optional budget line."""
    row_h = 28
    f = Frame(width=720, height=12 + 40 + row_h * max(len(rows), 1), left=180, top=12, bottom=40)
    top = nice_max(max([r[3] for r in rows] + ([budget] if budget else []) + [1e-6]))

    def x(v: float) -> float:
        return f.left + f.plot_w * min(v, top) / top

    body = []
    for i in range(5):
        gx = f.left + f.plot_w * i / 4
        body.append(f'<line x1="{gx:.1f}" x2="{gx:.1f}" y1="{f.top}" y2="{f.top + f.plot_h:.1f}" '
                    f'stroke="{GRID}"/>')
        body.append(_text(gx, f.top + f.plot_h + 16, percent_label(top * i / 4)))
    for i, (label, p, low, high) in enumerate(rows):
        cy = f.top + row_h * (i + 0.5)
        shown = label if len(label) <= 26 else label[:25] + "…"
        body.append(_text(f.left - 10, cy + 4, shown, "end", INK))
        body.append(f'<line x1="{x(low):.1f}" x2="{x(high):.1f}" y1="{cy:.1f}" y2="{cy:.1f}" '
                    f'stroke="{BLUE}" stroke-width="2"/>')
        for end in (low, high):
            body.append(f'<line x1="{x(end):.1f}" x2="{x(end):.1f}" y1="{cy - 5:.1f}" y2="{cy + 5:.1f}" '
                        f'stroke="{BLUE}" stroke-width="2"/>')
        body.append(f'<circle cx="{x(p):.1f}" cy="{cy:.1f}" r="4.5" fill="{BLUE}"/>')
    if budget is not None:
        bx = x(budget)
        body.append(f'<line x1="{bx:.1f}" x2="{bx:.1f}" y1="{f.top - 4}" y2="{f.top + f.plot_h:.1f}" '
                    f'stroke="{AMBER}" stroke-width="2" stroke-dasharray="5 4"/>')
        body.append(_text(bx + 4, f.top + 8, f"budget {percent_label(budget)}", "start", AMBER))
    body.append(_text(f.left + f.plot_w / 2, f.height - 6, "drifted calls (dot) with 95% Wilson interval",
                      fill=INK))
    return _svg(f.width, f.height, title, body)


@dataclass(frozen=True)
class FrontierPoint:
    label: str
    speedup: float
    drift: float
    low: float
    high: float
    pareto: bool


def frontier_chart(points: Sequence[FrontierPoint], title: str, budget: float | None = None,
                   y_title: str = "drifted calls", budget_label: str = "call drift budget") -> str:
    """Drift (y, with its 95% interval) against speedup over the baseline (x): one dot per candidate, filled
    when Pareto-optimal; the baseline itself sits at 1.0x and 0 drift; an optional call drift budget line. A
    sampled matrix draws its shifted calls instead (`y_title`, `budget_label`)."""
    f = Frame(height=340, top=30, left=72)
    top = nice_max(max([p.high for p in points] + ([budget] if budget else []) + [1e-6]))
    x_max = max([p.speedup for p in points] + [1.0]) * 1.15
    x_max = math.ceil(x_max * 4) / 4

    def x(v: float) -> float:
        return f.left + f.plot_w * min(max(v, 0.0), x_max) / x_max

    def y(v: float) -> float:
        return f.top + f.plot_h * (1 - min(v, top) / top)

    body = f.y_axis(top, percent_label)
    step = 0.25 if x_max <= 2 else 0.5 if x_max <= 4 else 1.0
    tick = 0.0
    while tick <= x_max + 1e-9:
        body.append(_text(x(tick), f.top + f.plot_h + 18, f"{tick:g}x"))
        tick += step
    body.append(f'<line x1="{x(1.0):.1f}" x2="{x(1.0):.1f}" y1="{f.top}" y2="{f.top + f.plot_h:.1f}" '
                f'stroke="{SLATE}" stroke-dasharray="3 3"/>')
    body.append(f'<rect x="{x(1.0) - 5:.1f}" y="{y(0) - 5:.1f}" width="10" height="10" fill="{INK}"/>')
    body.append(_text(x(1.0) + 8, y(0) - 8, "baseline", "start", INK))
    if budget is not None:
        by = y(budget)
        body.append(f'<line x1="{f.left}" x2="{f.left + f.plot_w:.1f}" y1="{by:.1f}" y2="{by:.1f}" '
                    f'stroke="{AMBER}" stroke-width="2" stroke-dasharray="5 4"/>')
        body.append(_text(f.left + f.plot_w - 4, by - 6, f"{budget_label} {percent_label(budget)}", "end", AMBER))
    for p in points:
        px = x(p.speedup)
        body.append(f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{y(p.high):.1f}" y2="{y(p.low):.1f}" '
                    f'stroke="{BLUE}" stroke-width="2"/>')
        fill = BLUE if p.pareto else "#fff"
        body.append(f'<circle cx="{px:.1f}" cy="{y(p.drift):.1f}" r="6" fill="{fill}" stroke="{BLUE}" '
                    f'stroke-width="2"/>')
        label = p.label if len(p.label) <= 24 else p.label[:23] + "…"
        body.append(_text(px + 10, y(p.drift) + 4, label, "start", INK))
    body += [f'<circle cx="{f.left + 16}" cy="13" r="5" fill="{BLUE}"/>',
             _text(f.left + 26, 17, "Pareto-optimal", "start", INK),
             f'<circle cx="{f.left + 146}" cy="13" r="5" fill="#fff" stroke="{BLUE}" stroke-width="2"/>',
             _text(f.left + 156, 17, "dominated (whisker: 95% CI)", "start", INK)]
    body += f.axis_titles("speedup over the baseline (tokens/s)", y_title)
    return _svg(f.width, f.height, title, body)


RED = "#b91c1c"
PURPLE = "#7c3aed"
# The runtime changes the history marks, each in its own lane above the plot: (kind, legend, colour).
CHANGE_LANES = (("config", "config changed", AMBER), ("decisions", "probe decisions changed", RED),
                ("numerics", "probe numerics changed", PURPLE))
_LEGEND_WIDTHS = {"config": 110, "decisions": 170, "numerics": 170}


@dataclass(frozen=True)
class HistoryPoint:
    """One run on the history chart: its drift with the 95% interval (None: no compared call) and the runtime
    changes since the previous run of its path pair (`analysis.history.CHANGE_KINDS`)."""

    run_id: int
    label: str  # under the x axis, e.g. "#12"
    date: str  # under the label, e.g. "06-11"
    p: float | None
    low: float | None
    high: float | None
    changes: tuple[str, ...] = ()
    tooltip: str = ""


def _marker(kind: str, x: float, y: float, colour: str) -> str:
    if kind == "config":
        return f'<rect x="{x - 5:.1f}" y="{y - 5:.1f}" width="10" height="10" fill="{colour}"/>'
    if kind == "decisions":
        return (f'<polygon points="{x:.1f},{y - 6:.1f} {x + 6:.1f},{y + 5:.1f} {x - 6:.1f},{y + 5:.1f}" '
                f'fill="{colour}"/>')
    return (f'<rect x="{x - 4.5:.1f}" y="{y - 4.5:.1f}" width="9" height="9" fill="{colour}" '
            f'transform="rotate(45 {x:.1f} {y:.1f})"/>')


def history_chart(points: Sequence[HistoryPoint], title: str, budget: float | None = None) -> str:
    """Drift over runs (oldest left): the point estimate as a line with its 95% band, an optional call drift
    budget line, and a lane per kind of runtime change above the plot with a marker on each run that changed.
    Points and markers carry `data-run-id` (markers also `data-change`), and each has a `<title>` tooltip."""
    lane_h = 14
    f = Frame(height=350, top=42 + lane_h * len(CHANGE_LANES), left=88, bottom=52)
    known = [pt for pt in points if pt.p is not None]
    top = nice_max(max([pt.high or 0.0 for pt in known] + ([budget] if budget else []) + [1e-6]))
    n = len(points)

    def x(i: int) -> float:
        return f.left + f.plot_w * (0.5 if n == 1 else 0.03 + 0.94 * i / (n - 1))

    def y(v: float) -> float:
        return f.top + f.plot_h * (1 - min(v, top) / top)

    body = f.y_axis(top, percent_label)
    index = {pt.run_id: i for i, pt in enumerate(points)}
    if known:
        band = [f"{x(index[pt.run_id]):.1f},{y(pt.high):.1f}" for pt in known] + [
            f"{x(index[pt.run_id]):.1f},{y(pt.low):.1f}" for pt in reversed(known)]
        body.append(f'<polygon class="band" points="{" ".join(band)}" fill="{BAND}" fill-opacity="0.6" '
                    'stroke="none"/>')
        line = " ".join(f"{x(index[pt.run_id]):.1f},{y(pt.p):.1f}" for pt in known)
        body.append(f'<polyline points="{line}" fill="none" stroke="{BLUE}" stroke-width="2"/>')
    if budget is not None:
        by = y(budget)
        body.append(f'<line class="budget" data-budget="{budget!r}" x1="{f.left}" x2="{f.left + f.plot_w:.1f}" '
                    f'y1="{by:.1f}" y2="{by:.1f}" stroke="{AMBER}" stroke-width="2" stroke-dasharray="5 4"/>')
        body.append(_text(f.left + f.plot_w - 4, by - 6, f"budget {percent_label(budget)}", "end", AMBER))
    for lane, (kind, _legend, colour) in enumerate(CHANGE_LANES):
        ly = f.top - lane_h * (len(CHANGE_LANES) - lane) + 2
        body.append(_text(f.left - 8, ly + 4, kind, "end", colour))
        body.append(f'<line x1="{f.left}" x2="{f.left + f.plot_w:.1f}" y1="{ly:.1f}" y2="{ly:.1f}" '
                    f'stroke="{GRID}" stroke-dasharray="1 3"/>')
    step = max(1, math.ceil(n / 12))  # at most about 12 labels under the axis
    for i, pt in enumerate(points):
        px = x(i)
        if pt.changes:
            body.append(f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{f.top:.1f}" y2="{f.top + f.plot_h:.1f}" '
                        f'stroke="{SLATE}" stroke-dasharray="2 3"/>')
        for lane, (kind, legend, colour) in enumerate(CHANGE_LANES):
            if kind in pt.changes:
                ly = f.top - lane_h * (len(CHANGE_LANES) - lane) + 2
                body.append(f'<g class="marker" data-run-id="{pt.run_id}" data-change="{kind}">'
                            f"<title>{escape(f'run {pt.run_id}: {legend}')}</title>"
                            f"{_marker(kind, px, ly, colour)}</g>")
        if pt.p is not None:
            tip = pt.tooltip or f"run {pt.run_id}: {percent_label(pt.p)}"
            body.append(f'<circle class="point" data-run-id="{pt.run_id}" cx="{px:.1f}" cy="{y(pt.p):.1f}" r="4" '
                        f'fill="{BLUE}"><title>{escape(tip)}</title></circle>')
        if i % step == 0 or i == n - 1:
            body.append(_text(px, f.top + f.plot_h + 16, pt.label, extra=f' data-run-id="{pt.run_id}"'))
            body.append(_text(px, f.top + f.plot_h + 30, pt.date))
    lx = f.left
    body += [f'<rect x="{lx}" y="6" width="14" height="10" fill="{BAND}"/>',
             f'<line x1="{lx}" x2="{lx + 14}" y1="11" y2="11" stroke="{BLUE}" stroke-width="2"/>',
             _text(lx + 20, 15, "drift (95% CI band)", "start", INK)]
    lx += 150
    for kind, legend, colour in CHANGE_LANES:
        body += [_marker(kind, lx + 5, 11, colour), _text(lx + 14, 15, legend, "start", INK)]
        lx += _LEGEND_WIDTHS[kind]
    body.append(_text(f.left + f.plot_w / 2, f.height - 6, "runs, oldest first", fill=INK))
    return _svg(f.width, f.height, title, body)


OUTCOME_LABEL = 16  # characters of an outcome shown under its bar; the full text is the bar's and label's <title>
OUTCOME_BARS = 8  # outcomes drawn per histogram; the rest are pooled into one bar


def clip_label(text: str, limit: int = OUTCOME_LABEL) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def pooled_outcomes(rows: Sequence[tuple[str, int, int]], bars: int = OUTCOME_BARS) -> list[tuple[str, int, int]]:
    """(outcome, baseline samples, candidate samples) rows as drawn: the first `bars - 1` kept and the rest pooled
    into one "(k other outcomes)" row when there are more than `bars`."""
    if len(rows) <= bars:
        return list(rows)
    rest = rows[bars - 1:]
    return [*rows[: bars - 1], (f"({len(rest)} other outcomes)", sum(r[1] for r in rest), sum(r[2] for r in rest))]


def shared_prefix(outcomes: Sequence[str], least: int = 6) -> str:
    """The start the tool-call signatures among `outcomes` share (`search_tickets({"limit":`), when at least `least`
    characters and more than one signature: left out of their labels, so the labels show what tells them apart."""
    calls = [o for o in outcomes if "(" in o]
    if len(calls) < 2:
        return ""
    prefix = os.path.commonprefix(calls)
    return prefix if len(prefix) >= least else ""


def outcome_histograms(rows: Sequence[tuple[str, int, int]], n_baseline: int, n_candidate: int, title: str) -> str:
    """Two outcome histograms side by side, baseline left and candidate right, on one count axis: a bar per
    outcome (the same outcomes in the same order in both), its height the samples of that side with that outcome.
    Long outcome labels are clipped under the bar; each bar and label carries the full outcome in a `<title>`.
    Bars carry `data-side`, `data-samples` and `data-outcome` (the SVG also `data-top`, its axis top)."""
    rows = pooled_outcomes(rows)
    prefix = shared_prefix([r[0] for r in rows])
    width, height, top_m, bottom_m, gap = 760, 310, 34, 120, 36
    panel_w = (width - gap) / 2
    left = 84
    plot_w, plot_h = panel_w - left - 8, height - top_m - bottom_m
    top = max(nice_max(max([max(r[1], r[2]) for r in rows] + [1])), 4.0)
    slot = plot_w / max(len(rows), 1)
    body = []
    for panel, (side, total, colour) in enumerate((("baseline", n_baseline, SLATE), ("candidate", n_candidate, BLUE))):
        x0 = panel * (panel_w + gap) + left
        body.append(f'<g class="histogram" data-side="{side}">')
        for i in range(5):
            value = top * i / 4
            y = top_m + plot_h * (1 - i / 4)
            body.append(f'<line x1="{x0:.1f}" x2="{x0 + plot_w:.1f}" y1="{y:.1f}" y2="{y:.1f}" stroke="{GRID}"/>')
            body.append(_text(x0 - 6, y + 4, f"{value:g}", "end"))
        body.append(_text(x0 + plot_w / 2, 16, f"{side} ({total} samples)", fill=INK,
                          extra=' font-weight="600"'))
        for i, row in enumerate(rows):
            outcome, count = row[0], row[1 + panel]
            h = plot_h * count / top
            bx = x0 + i * slot + slot * 0.15
            tip = escape(f"{outcome}: {count} of {total} samples")
            body.append(f'<rect class="bar" data-side="{side}" data-samples="{count}" '
                        f'data-outcome="{escape(outcome, quote=True)}" x="{bx:.2f}" y="{top_m + plot_h - h:.2f}" '
                        f'width="{slot * 0.7:.2f}" height="{h:.2f}" fill="{colour}" rx="2"><title>{tip}</title>'
                        "</rect>")
            if count:
                body.append(_text(bx + slot * 0.35, top_m + plot_h - h - 4, str(count), fill=INK))
            cx, cy = x0 + (i + 0.5) * slot, top_m + plot_h + 12
            shown = "…" + outcome[len(prefix):] if prefix and outcome.startswith(prefix) else outcome
            body.append(f'<g class="label"><title>{escape(outcome)}</title>'
                        + _text(cx, cy, clip_label(shown), "end", extra=f' transform="rotate(-40 {cx:.1f} {cy:.1f})"')
                        + "</g>")
        body.append("</g>")
    if prefix:
        body.append(_text(8, height - 8, f"… = {clip_label(prefix, 80)}", "start", extra=' class="prefix"'))
    svg = _svg(width, height, title, body)
    return svg.replace('class="chart"', f'class="chart outcomes" data-top="{top:g}"', 1)
