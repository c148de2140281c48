"""The inline SVG charts: labels escaped, round axis tops."""

from __future__ import annotations

from toolaudit.report.charts import histogram, interval_chart, nice_max, percent_label, session_drift_chart


def test_charts_escape_labels_and_pick_round_axes():
    assert [nice_max(v) for v in (0.013, 0.2, 0.45, 0.7, 3)] == [0.02, 0.2, 0.5, 1.0, 5]
    assert [percent_label(v) for v in (0, 0.0125, 0.125, 1.0)] == ["0%", "1.25%", "12.5%", "100%"]
    svg = interval_chart([('<img src=x onerror="boom">', 0.1, 0.05, 0.2)], "t & <t>", budget=0.15)
    assert "<img" not in svg and "&lt;img src=x" in svg and "<title>t &amp; &lt;t&gt;</title>" in svg
    assert "<script" not in histogram([("<script>", 1, True)], "h", "x", "a", "b")
    line_svg = session_drift_chart([(n, 0.1 * n / 10, 0.0, 0.2) for n in range(1, 11)], (3.5, 0.05), "s")
    assert line_svg.count("<circle") == 10 and "observed" in line_svg
