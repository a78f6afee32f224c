"""Line charts as inline SVG markup for the HTML dashboard, generated in Python with every text escaped.

The dashboard needs no JavaScript, no plotting library and no network, and opens from file:// the same
everywhere. Every string placed in the SVG (titles, labels, legend names, tooltips, attributes) goes through
``escape``, so :func:`line_chart` can return ``markupsafe.Markup`` that the autoescaping templates insert as
is. The ``<svg>`` carries no ``xmlns``: the HTML parser puts inline SVG in its namespace, and the page holds
no URL at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

from markupsafe import Markup

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")
REGRESSION_COLOR = "#d62728"
MAX_X_LABELS = 12


@dataclass
class Line:
    """One named series: ``points`` drawn as dots with tooltips, ``path`` (x, y) joined by a line."""

    name: str
    color: str
    points: list[tuple[float, float, str]] = field(default_factory=list)  # (x, y, tooltip)
    path: list[tuple[float, float]] = field(default_factory=list)
    dashed: bool = False


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values covering [low, high] (steps of 1, 2 or 5 times a power of ten)."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return [0.0, 1.0]
    if high <= low:
        pad = abs(low) * 0.05 or 0.5
        low, high = low - pad, high + pad
    raw = (high - low) / max(count - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(low / step) * step
    ticks, value = [], first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    if ticks[-1] < high:
        ticks.append(round(value, 12))
    return ticks


def _fmt_tick(value: float) -> str:
    return f"{value:.4g}"


def line_chart(title: str, lines: list[Line], *, x_labels: list[str] | None = None, y_label: str = "",
               markers: list[tuple[float, str]] = (), width: int = 430, height: int = 240,
               css_class: str = "chart", y_floor: float | None = None, note: str = "") -> Markup:
    """An SVG chart, as Markup (every text in it escaped); ``x_labels[i]`` labels x = i (thinned to
    MAX_X_LABELS), ``markers`` are (x, label) vertical red lines (flagged regressions). ``y_floor``: the y axis
    reaches down to it at least (0 for a rate), so that noise of a fraction of a percent is not zoomed into a
    cliff; ``note``: a line of text over the plot (e.g. that one commit makes no trend)."""
    width, height = int(width), int(height)
    left, right, top, bottom = 58, 12, 44, 62
    plot_w, plot_h = width - left - right, height - top - bottom
    xs = [p[0] for ln in lines for p in ln.points] + [p[0] for ln in lines for p in ln.path] + [m[0] for m in markers]
    ys = [p[1] for ln in lines for p in ln.points] + [p[1] for ln in lines for p in ln.path]
    ys = [y for y in ys if math.isfinite(y)]
    out = [f'<svg class="{escape(css_class)}" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
           f'<title>{escape(title)}</title>',
           f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
           f'<text x="8" y="18" font-size="13" font-weight="bold">{escape(title)}</text>']
    if not ys:
        out.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" fill="#777">no data</text></svg>')
        return Markup("\n".join(out))
    x_low, x_high = (min(xs), max(xs)) if xs else (0.0, 1.0)
    if x_high == x_low:
        x_low, x_high = x_low - 0.5, x_high + 0.5
    ticks = nice_ticks(min(ys) if y_floor is None else min(y_floor, min(ys)), max(ys))
    y_low, y_high = ticks[0], ticks[-1]

    def sx(x: float) -> float:
        return left + (x - x_low) / (x_high - x_low) * plot_w

    def sy(y: float) -> float:
        return top + (1 - (y - y_low) / (y_high - y_low)) * plot_h

    for t in ticks:
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{left - 6}" y="{sy(t) + 4:.1f}" font-size="10" text-anchor="end">{_fmt_tick(t)}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>')
    if y_label:
        out.append(f'<text transform="translate(14,{top + plot_h / 2:.1f}) rotate(-90)" font-size="10" '
                   f'text-anchor="middle">{escape(y_label)}</text>')
    if x_labels:
        stride = max(1, math.ceil(len(x_labels) / MAX_X_LABELS))
        for i in range(0, len(x_labels), stride):
            x, y = sx(i), top + plot_h + 10
            out.append(f'<text transform="translate({x:.1f},{y}) rotate(-40)" font-size="9" '
                       f'text-anchor="end">{escape(x_labels[i])}</text>')
    for x, label in markers:
        out.append(f'<g class="regression-marker"><line x1="{sx(x):.1f}" x2="{sx(x):.1f}" y1="{top}" '
                   f'y2="{top + plot_h}" stroke="{REGRESSION_COLOR}" stroke-width="1.5" stroke-dasharray="4 3"/>'
                   f'<title>{escape(label)}</title></g>')
    for ln in lines:
        dash = ' stroke-dasharray="5 4"' if ln.dashed else ""
        if len(ln.path) > 1:
            d = " ".join(f"{'M' if i == 0 else 'L'}{sx(x):.1f},{sy(y):.1f}" for i, (x, y) in enumerate(ln.path)
                         if math.isfinite(y))
            out.append(f'<path d="{d}" fill="none" stroke="{escape(ln.color)}" stroke-width="1.8"{dash}/>')
        for x, y, tip in ln.points:
            if math.isfinite(y):
                out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.6" fill="{escape(ln.color)}">'
                           f'<title>{escape(tip)}</title></circle>')
    if note:
        out.append(f'<text class="chart-note" x="{left + plot_w / 2:.1f}" y="{top + 16}" font-size="11" '
                   f'text-anchor="middle" fill="#777">{escape(note)}</text>')
    # the legend sits in the title row, right-aligned, so it never hides data
    x = width - right
    for ln in reversed(lines):
        x -= 24 + 6 * len(ln.name)
        dash = ' stroke-dasharray="5 4"' if ln.dashed else ""
        out.append(f'<line x1="{x}" x2="{x + 16}" y1="30" y2="30" stroke="{escape(ln.color)}" stroke-width="2"{dash}/>'
                   f'<text x="{x + 19}" y="34" font-size="10">{escape(ln.name)}</text>')
    out.append("</svg>")
    return Markup("\n".join(out))
