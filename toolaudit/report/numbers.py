"""How every view writes a number: rates, points, signed differences, p-values, TV distances and intervals.

The terminal, the Markdown and HTML reports and the gate's messages all format through here, so a figure reads
the same everywhere (`4.55%`, `+4.72pp`, `p = 0.013`). Nothing here computes a figure. `absent` is what a view
prints for a figure there is none of (the terminal's "-", the reports' "n/a")."""

from __future__ import annotations


def pct(p: float | None, absent: str = "-") -> str:
    """A rate as people read it: `4.55%`."""
    return absent if p is None else f"{100 * p:.2f}%"


def points(x: float | None, absent: str = "-", unit: str = "pp") -> str:
    """A difference of rates without sign, in percentage points: `4.72pp`."""
    return absent if x is None else f"{100 * x:.2f}{unit}"


def signed_points(x: float | None, absent: str = "-", unit: str = "pp") -> str:
    """A difference of rates with its sign: `+4.72pp`, never `-0.00pp`."""
    return absent if x is None else f"{x * 100 + 0.0:+.2f}{unit}"


def p_value(p: float | None, absent: str = "-") -> str:
    """`0.013`, or `4.2e-05` below 0.001."""
    if p is None:
        return absent
    return f"{p:.2g}" if p < 0.001 else f"{p:.3f}"


def tv(x: float | None, absent: str = "-") -> str:
    """A total variation distance: `0.35`."""
    return absent if x is None else f"{x:.2f}"


def num(value: float | None, digits: int = 1, absent: str = "n/a") -> str:
    """A plain quantity with thousands separators: `1,234.5`."""
    return absent if value is None else f"{value:,.{digits}f}"


def span(low: float | None, high: float | None, form=signed_points, absent: str = "-") -> str:
    """An interval's ends in the form of its estimate: `-2.58pp to +11.84pp` (`form`: signed_points, pct, ...)."""
    if low is None or high is None:
        return absent
    return f"{form(low)} to {form(high)}"


def interval(low: float | None, high: float | None, form=pct, absent: str = "-") -> str:
    """A 95% interval in the form of its estimate: `95% CI 2.10% to 6.30%`."""
    ends = span(low, high, form, absent)
    return ends if ends == absent else f"95% CI {ends}"
