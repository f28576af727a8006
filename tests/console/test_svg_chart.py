"""The SVG line chart (ferry_console/svg_chart.py): scaling, an empty series, one point, escaping."""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from ferry_console.svg_chart import (
    BOTTOM,
    HEIGHT,
    LEFT,
    MAX_LINES,
    RIGHT,
    TOP,
    WIDTH,
    Line,
    line_chart,
    nice_ceiling,
    short_number,
)

NS = {"s": "http://www.w3.org/2000/svg"}
PLOT_BOTTOM = HEIGHT - BOTTOM
PLOT_RIGHT = WIDTH - RIGHT


def _parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)   # well-formed XML, or this raises


def _coords(path: ET.Element) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in re.findall(r"[ML]([\d.]+),([\d.]+)", path.get("d", ""))]


def test_points_are_scaled_to_the_plot_area() -> None:
    svg = _parse(line_chart("Rate", [Line("produced", [(100.0, 0.0), (110.0, 40.0),
                                                       (120.0, 80.0)])], "msg/s", "c1"))
    assert svg.get("id") == "c1" and svg.get("aria-label") == "Rate"
    assert svg.find("s:title", NS).text == "Rate"   # type: ignore[union-attr]
    (path,) = svg.findall("s:path", NS)
    # 80 rounds up to 100: the y axis is 0..100; time runs over the whole width
    assert _coords(path) == [(LEFT, PLOT_BOTTOM), (LEFT + (PLOT_RIGHT - LEFT) / 2,
                                                    PLOT_BOTTOM - 0.4 * (PLOT_BOTTOM - TOP)),
                             (PLOT_RIGHT, PLOT_BOTTOM - 0.8 * (PLOT_BOTTOM - TOP))]
    ticks = [t.text for t in svg.findall("s:text", NS) if "chart-tick-y" in t.get("class", "")]
    assert ticks == ["0", "50", "100"]
    xs = [t.text for t in svg.findall("s:text", NS) if "chart-tick-x" in t.get("class", "")]
    assert xs == ["00:01:40", "00:02:00"]
    assert len(svg.findall("s:line", NS)) >= 2   # both axes


def test_an_empty_series_says_so_and_draws_no_line() -> None:
    svg = _parse(line_chart("Lag of g", [Line("lag", [])], "messages"))
    assert svg.findall("s:path", NS) == []
    assert [t.text for t in svg.findall("s:text", NS)
            if t.get("class") == "chart-empty"] == ["no samples yet"]
    assert _parse(line_chart("none", [], "x")).findall("s:path", NS) == []


def test_a_single_point_is_a_dot_at_the_right_edge() -> None:
    svg = _parse(line_chart("Disk", [Line("a/0", [(5.0, 0.0)])], "%"))
    (path,) = svg.findall("s:path", NS)
    assert _coords(path) == [(PLOT_RIGHT, PLOT_BOTTOM)] * 2   # all zero: 0 sits on the axis
    (dot,) = svg.findall("s:circle", NS)
    assert float(dot.get("cx", "0")) == PLOT_RIGHT


def test_labels_are_escaped_and_extra_lines_are_counted() -> None:
    lines = [Line(f"<b>{i}&", [(1.0, i), (2.0, i)]) for i in range(MAX_LINES + 2)]
    svg = _parse(line_chart('<script>"x"</script>', lines, "&"))
    assert len(svg.findall("s:path", NS)) == MAX_LINES
    assert svg.findall("s:path", NS)[0].get("data-series") == "<b>0&"
    assert "<script>" not in str(line_chart("<script>", [], "u"))
    assert [t.text for t in svg.findall("s:text", NS)
            if t.get("class") == "chart-more"] == ["2 more not drawn"]


def test_round_numbers() -> None:
    assert [nice_ceiling(v) for v in (0, 0.3, 1, 3, 7, 11, 240, 2600)] == \
        [1, 0.5, 1, 5, 10, 20, 250, 5000]
    assert [short_number(v) for v in (0, 2.5, 120, 1500, 3e6, 2e9)] == \
        ["0", "2.5", "120", "1.5k", "3M", "2G"]
