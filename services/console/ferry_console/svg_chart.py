"""A line chart as inline SVG, drawn on the server: readable without JavaScript.

`line_chart(title, lines, unit)` draws one `<path class="chart-line">` per
series over a shared time axis: the y axis runs from 0 to a round number at
or above the largest value (1 when every value is 0) with three labelled
ticks; the x axis from the first sample to the last, labelled with their UTC
times. A series of one point is a dot (`<circle class="chart-dot">`) and a
path of zero length; no point at all is the text "no samples yet". Text is
escaped; the result is `Markup` for a Jinja template.
"""
from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

from ferry_console.series import Points

WIDTH, HEIGHT = 640, 220
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 30, 40   # margins around the plot area
COLOURS = ("#1f6feb", "#2e7d32", "#b26a00", "#c62828", "#6f42c1", "#00838f")
MAX_LINES = len(COLOURS)   # more series than colours: the rest are left out, said so


@dataclass(frozen=True)
class Line:
    """One series of a chart and its legend label."""

    label: str
    points: Points


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten at or above `value` (> 0)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * power >= value:
            return float(step * power)
    return 10.0 * power   # pragma: no cover - 10 always fits


def short_number(value: float) -> str:
    """A tick label: 0, 2.5, 120, 1.5k, 3M, 2G."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.3g}{suffix}"
    return f"{value:.3g}"


def _clock(at_s: float) -> str:
    return dt.datetime.fromtimestamp(at_s, tz=dt.UTC).strftime("%H:%M:%S")


def scale(lines: Sequence[Line]) -> tuple[float, float, float]:
    """(first time, last time, top of the y axis) over every point of `lines`."""
    times = [t for line in lines for t, _ in line.points]
    values = [v for line in lines for _, v in line.points]
    t0, t1 = min(times), max(times)
    if t1 <= t0:
        t0 = t1 - 1.0   # one instant: it sits at the right edge
    return t0, t1, nice_ceiling(max(values))


def line_chart(title: str, lines: Sequence[Line], unit: str, chart_id: str = "") -> Markup:
    """The SVG of `lines` (at most MAX_LINES) under `title`; `unit` labels the y axis."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    drawn = [line for line in lines[:MAX_LINES] if line.points]
    ident = f' id="{escape(chart_id)}"' if chart_id else ""
    out = [f'<svg{ident} class="chart" xmlns="http://www.w3.org/2000/svg" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" '
           f'aria-label="{escape(title)}">',
           f"<title>{escape(title)}</title>",
           f'<text class="chart-title" x="{LEFT}" y="18" font-size="13" font-weight="600">'
           f"{escape(title)}</text>",
           f'<line class="chart-axis chart-axis-x" x1="{LEFT}" y1="{TOP + plot_h}" '
           f'x2="{LEFT + plot_w}" y2="{TOP + plot_h}" stroke="#5b6b7c"/>',
           f'<line class="chart-axis chart-axis-y" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" '
           f'y2="{TOP + plot_h}" stroke="#5b6b7c"/>',
           f'<text class="chart-unit" x="4" y="{TOP - 8}" font-size="11" fill="#5b6b7c">'
           f"{escape(unit)}</text>"]
    if not drawn:
        out.append(f'<text class="chart-empty" x="{LEFT + plot_w / 2}" y="{TOP + plot_h / 2}" '
                   f'text-anchor="middle" font-size="12" fill="#5b6b7c">no samples yet</text>')
        return Markup("".join(out) + "</svg>")
    t0, t1, top = scale(drawn)

    def x(t: float) -> float:
        return round(LEFT + (t - t0) / (t1 - t0) * plot_w, 1)

    def y(v: float) -> float:
        return round(TOP + plot_h - min(max(v, 0.0), top) / top * plot_h, 1)

    for tick in (0.0, top / 2, top):
        out.append(f'<line class="chart-grid" x1="{LEFT}" y1="{y(tick)}" x2="{LEFT + plot_w}" '
                   f'y2="{y(tick)}" stroke="#eef2f6"/>'
                   f'<text class="chart-tick chart-tick-y" x="{LEFT - 6}" y="{y(tick) + 4}" '
                   f'text-anchor="end" font-size="11">{short_number(tick)}</text>')
    for at, anchor in ((t0, "start"), (t1, "end")):
        out.append(f'<text class="chart-tick chart-tick-x" x="{x(at)}" y="{TOP + plot_h + 16}" '
                   f'text-anchor="{anchor}" font-size="11">{_clock(at)}</text>')
    out.append(f'<text class="chart-axis-label" x="{LEFT + plot_w / 2}" y="{HEIGHT - 6}" '
               f'text-anchor="middle" font-size="11" fill="#5b6b7c">time (UTC)</text>')
    for i, line in enumerate(drawn):
        colour = COLOURS[i]
        pts = line.points
        d = f"M{x(pts[0][0])},{y(pts[0][1])}" + "".join(f" L{x(t)},{y(v)}" for t, v in pts[1:])
        if len(pts) == 1:
            d += f" L{x(pts[0][0])},{y(pts[0][1])}"
            out.append(f'<circle class="chart-dot" cx="{x(pts[0][0])}" cy="{y(pts[0][1])}" '
                       f'r="3" fill="{colour}"/>')
        dashes = ' stroke-dasharray="6 3"' if i % 2 else ""   # where lines overlap
        out.append(f'<path class="chart-line" data-series="{escape(line.label)}" d="{d}" '
                   f'fill="none" stroke="{colour}" stroke-width="1.8" '
                   f'stroke-linejoin="round"{dashes}/>')
        out.append(f'<text class="chart-legend" x="{LEFT + plot_w - 4}" y="{TOP + 12 + 14 * i}" '
                   f'text-anchor="end" font-size="11" fill="{colour}">{escape(line.label)} '
                   f"({short_number(pts[-1][1])})</text>")
    if len(lines) > MAX_LINES:
        out.append(f'<text class="chart-more" x="{LEFT + 4}" y="{TOP + 12}" font-size="11" '
                   f'fill="#5b6b7c">{len(lines) - MAX_LINES} more not drawn</text>')
    return Markup("".join(out) + "</svg>")
