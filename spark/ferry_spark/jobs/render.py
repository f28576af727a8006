"""The report's HTML page: tables and matplotlib figures, PNGs embedded, one file.

The page needs nothing beside itself (no script, no stylesheet, no image file):
it can be mailed, archived with the Parquet tables, or opened from a CI artefact.
"""
from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")   # no display on a driver; set before pyplot is imported

import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

#: Rows beyond this many are left out of a bar chart (the table keeps them all).
MAX_BARS = 30
#: Lines beyond this many are left out of a time plot (the busiest are kept).
MAX_LINES = 12
FIG_DPI = 96
PAGE_CSS = """
body{font-family:system-ui,sans-serif;margin:24px auto;max-width:1100px;color:#222}
h1{font-size:1.6em;margin-bottom:0}
h2{border-bottom:1px solid #ccc;padding-bottom:4px;margin-top:32px}
.meta{color:#666}table{border-collapse:collapse;font-size:.85em;margin:8px 0}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:right}th{background:#f3f3f3}
td:first-child,td:nth-child(2),td:nth-child(3){text-align:left}
img{max-width:100%;border:1px solid #eee}.src{color:#555;font-size:.9em}
.cards{display:flex;gap:12px;flex-wrap:wrap}.card{border:1px solid #ddd;border-radius:6px;
padding:8px 14px;min-width:120px}.card b{display:block;font-size:1.4em}
"""


@dataclass(frozen=True)
class Section:
    """One part of the page: a title, where its figures come from, a figure, a table."""

    title: str
    source: str
    table: pd.DataFrame
    figure: Figure | None = None


def png_data_uri(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=FIG_DPI, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _label(row: pd.Series, cols: Sequence[str]) -> str:
    return " · ".join(str(row[c]) for c in cols)


def latency_bars(df: pd.DataFrame, keys: Sequence[str], title: str) -> Figure | None:
    """Horizontal bars of p50 / p95 / p99 (ms) per row of `df`."""
    if df.empty:
        return None
    rows = df.head(MAX_BARS)
    labels = [_label(r, keys) for _, r in rows.iterrows()]
    fig, ax = plt.subplots(figsize=(10, 0.9 + 0.32 * len(rows) * 1.6))
    height = 0.26
    for i, (col, color) in enumerate((("p50_ms", "#4c72b0"), ("p95_ms", "#dd8452"),
                                      ("p99_ms", "#c44e52"))):
        ax.barh([y + (i - 1) * height for y in range(len(rows))], rows[col], height,
                label=col.replace("_ms", ""), color=color)
    ax.set_yticks(range(len(rows)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the producer's send")
    ax.set_title(title)
    ax.legend(loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    return fig


def time_lines(df: pd.DataFrame, keys: Sequence[str], x: str, y: str, title: str,
               ylabel: str, step: bool = False) -> Figure | None:
    """One line per `keys` combination of `y` over `x` (the busiest MAX_LINES)."""
    if df.empty:
        return None
    fig, ax = plt.subplots(figsize=(10, 3.6))
    busiest = df.groupby(list(keys))[y].sum().sort_values(ascending=False).head(MAX_LINES)
    for key in busiest.index:
        key_t = key if isinstance(key, tuple) else (key,)
        mask = pd.Series(True, index=df.index)
        for col, value in zip(keys, key_t, strict=True):
            mask &= df[col] == value
        part = df[mask].sort_values(x)
        label = " · ".join(map(str, key_t))
        if step:
            ax.step(part[x], part[y], where="post", label=label)
        else:
            ax.plot(part[x], part[y], marker="o", markersize=3, label=label)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_ylim(bottom=0)
    first, last = pd.Timestamp(df[x].min()), pd.Timestamp(df[x].max())
    if first == last:   # one point alone would stretch the axis over years
        ax.set_xlim(first - pd.Timedelta(minutes=1), last + pd.Timedelta(minutes=1))
    locator = mdates.AutoDateLocator()
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    return fig


def count_bars(df: pd.DataFrame, keys: Sequence[str], cols: Sequence[str],
               title: str) -> Figure | None:
    """Grouped horizontal bars of counts `cols` per row of `df`."""
    if df.empty:
        return None
    rows = df.head(MAX_BARS)
    labels = [_label(r, keys) for _, r in rows.iterrows()]
    fig, ax = plt.subplots(figsize=(10, 0.9 + 0.45 * len(rows) * len(cols) / 2 + 0.5))
    height = 0.8 / len(cols)
    for i, col in enumerate(cols):
        ax.barh([y + (i - (len(cols) - 1) / 2) * height for y in range(len(rows))], rows[col],
                height, label=col)
    ax.set_yticks(range(len(rows)), labels)
    ax.invert_yaxis()
    ax.set_title(title)
    ax.legend(loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    return fig


def _table_html(df: pd.DataFrame) -> str:
    if df.empty:
        return "<p class='src'>(nothing in this run)</p>"
    return df.to_html(index=False, border=0, float_format=lambda v: f"{v:,.1f}",
                      na_rep="", escape=True)


def page(title: str, meta: str, cards: dict[str, object], sections: Sequence[Section]) -> str:
    """The whole HTML document."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
             f"</title><style>{PAGE_CSS}</style></head><body>",
             f"<h1>{html.escape(title)}</h1><p class='meta'>{html.escape(meta)}</p>",
             "<div class='cards'>" + "".join(
                 f"<div class='card'>{html.escape(k)}<b>{html.escape(str(v))}</b></div>"
                 for k, v in cards.items()) + "</div>"]
    for sec in sections:
        parts.append(f"<h2>{html.escape(sec.title)}</h2>"
                     f"<p class='src'>{html.escape(sec.source)}</p>")
        if sec.figure is not None:
            parts.append(f"<img alt='{html.escape(sec.title)}' src='{png_data_uri(sec.figure)}'>")
        parts.append(_table_html(sec.table))
    parts.append("</body></html>")
    return "\n".join(parts)
