"""Plots as inline SVG, generated here: a line chart (series, a shaded band, reference
lines, marked points, a linear or log2 x axis) and a heat map. No plotting library: the
report must open on a compute node or a laptop with nothing installed and no network, and
these two shapes are all it draws.

Every text that reaches the SVG goes through :func:`dsenv.htmlreport.page.esc`. Each plot is
an ``<svg role="img" data-plot=NAME>`` with an ``aria-label``, so a reader (or a test) finds it
by name.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from dsenv.htmlreport.page import esc

WIDTH, HEIGHT = 640, 260
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 24, 44  # margins: the axis labels live there
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf")


@dataclass
class Series:
    name: str
    points: Sequence[tuple[float, float]]
    dots: bool = False  # markers at each point (few points: eval losses, message sizes)
    line: bool = True  # joined by a line (False: points that are not a sequence, per rank)


@dataclass
class Chart:
    """What :func:`line_chart` draws. ``band``: (low, high, label) shaded across the plot;
    ``hlines``: (y, label) dashed; ``vlines``: (x, label) dotted (the warm-up's end);
    ``marks``: (x, y, label) circled points (where a verdict was taken)."""

    name: str
    title: str
    x_label: str
    y_label: str
    series: list[Series]
    log2_x: bool = False
    band: tuple[float, float, str] | None = None
    hlines: list[tuple[float, str]] = field(default_factory=list)
    vlines: list[tuple[float, str]] = field(default_factory=list)
    marks: list[tuple[float, float, str]] = field(default_factory=list)
    measured: list[tuple[float, str]] = field(default_factory=list)  # (y, label): solid lines
    x_format: object = None  # a function: tick value -> text


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high]."""
    if high <= low:
        return [low]
    raw = (high - low) / count
    step = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if raw <= factor * step:
            step *= factor
            break
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step + 1e-9) + 1)]


def _num(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000 or abs(value) < 0.01:
        return f"{value:.3g}"
    return f"{value:.3g}".rstrip("0").rstrip(".") if "." in f"{value:.3g}" else f"{value:.3g}"


def line_chart(chart: Chart) -> str:
    """The chart as one ``<svg>`` element; an empty plot says "no data" in its place."""
    points = [p for s in chart.series for p in s.points
              if p[1] is not None and math.isfinite(p[1])]
    label = esc(f"{chart.title}: {chart.y_label} against {chart.x_label}")
    head = (f'<svg role="img" data-plot="{esc(chart.name)}" aria-label="{label}" '
            f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
            f'xmlns="http://www.w3.org/2000/svg">')
    if not points:
        return (f'{head}<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" '
                f'class="nodata">no data for {esc(chart.title)}</text></svg>')

    def fx(x):
        return math.log2(x) if chart.log2_x else x

    xs = [fx(p[0]) for p in points] + [fx(x) for x, _ in chart.vlines]
    ys = [p[1] for p in points] + [y for y, _ in chart.hlines + chart.measured]
    if chart.band:
        ys += [chart.band[0], chart.band[1]]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(0.0, min(ys)), max(ys)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    y1 = y1 * 1.08 if y1 > 0 else 1.0
    inner_w, inner_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x):
        return LEFT + (fx(x) - x0) / (x1 - x0) * inner_w

    def py(y):
        return TOP + inner_h - (y - y0) / (y1 - y0) * inner_h

    out = [head, f'<title>{label}</title>',
           f'<rect x="{LEFT}" y="{TOP}" width="{inner_w}" height="{inner_h}" class="frame"/>']
    if chart.band:
        low, high, text = chart.band
        out.append(f'<rect class="band" data-band="{esc(text)}" x="{LEFT}" y="{py(high):.1f}" '
                   f'width="{inner_w}" height="{max(py(low) - py(high), 1):.1f}">'
                   f'<title>{esc(text)}</title></rect>')
    for y in _ticks(y0, y1):
        out.append(f'<line class="grid" x1="{LEFT}" x2="{LEFT + inner_w}" y1="{py(y):.1f}" '
                   f'y2="{py(y):.1f}"/><text class="tick" x="{LEFT - 6}" y="{py(y) + 4:.1f}" '
                   f'text-anchor="end">{_num(y)}</text>')
    if chart.log2_x:
        x_ticks = [2 ** e for e in range(math.ceil(x0), math.floor(x1) + 1)]
        if len(x_ticks) > 8:
            x_ticks = x_ticks[::math.ceil(len(x_ticks) / 8)]
    else:
        x_ticks = _ticks(x0, x1)
    fmt = chart.x_format or _num
    for x in x_ticks:
        out.append(f'<text class="tick" x="{px(x):.1f}" y="{TOP + inner_h + 16}" '
                   f'text-anchor="middle">{esc(fmt(x))}</text>')
    out.append(f'<text class="axis" x="{LEFT + inner_w / 2}" y="{HEIGHT - 6}" '
               f'text-anchor="middle">{esc(chart.x_label)}</text>')
    out.append(f'<text class="axis" transform="translate(14 {TOP + inner_h / 2}) rotate(-90)" '
               f'text-anchor="middle">{esc(chart.y_label)}</text>')
    for y, text in chart.hlines:
        out.append(f'<line class="ref" data-ref="{esc(text)}" x1="{LEFT}" '
                   f'x2="{LEFT + inner_w}" y1="{py(y):.1f}" y2="{py(y):.1f}">'
                   f'<title>{esc(text)}</title></line>')
    for y, text in chart.measured:
        out.append(f'<line class="measured" data-measured="{esc(text)}" x1="{LEFT}" '
                   f'x2="{LEFT + inner_w}" y1="{py(y):.1f}" y2="{py(y):.1f}">'
                   f'<title>{esc(text)}</title></line>')
    for x, text in chart.vlines:
        out.append(f'<line class="vline" data-vline="{esc(text)}" x1="{px(x):.1f}" '
                   f'x2="{px(x):.1f}" y1="{TOP}" y2="{TOP + inner_h}"><title>{esc(text)}</title>'
                   f'</line><text class="tick" x="{px(x) + 4:.1f}" y="{TOP + inner_h - 6}">'
                   f'{esc(text)}</text>')
    for i, series in enumerate(chart.series):
        colour = COLOURS[i % len(COLOURS)]
        shown = [(px(x), py(y)) for x, y in series.points if y is not None and math.isfinite(y)]
        if series.line and len(shown) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in shown)
            out.append(f'<polyline class="series" data-series="{esc(series.name)}" '
                       f'fill="none" stroke="{colour}" stroke-width="1.6" points="{path}"/>')
        if series.dots or len(shown) == 1:
            out += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"/>'
                    for x, y in shown]
        out.append(f'<text class="legend" x="{LEFT + inner_w - 8}" y="{TOP + 14 + 14 * i}" '
                   f'text-anchor="end" '
                   f'fill="{colour}">{esc(series.name)}</text>')
    for x, y, text in chart.marks:
        out.append(f'<circle class="mark" data-mark="{esc(text)}" cx="{px(x):.1f}" '
                   f'cy="{py(y):.1f}" r="7"><title>{esc(text)}</title></circle>')
    out.append("</svg>")
    return "".join(out)


def heat_map(name: str, title: str, labels: Sequence[str],
             cells: dict[tuple[int, int], float], *, unit: str,
             marked: set[tuple[int, int]] = frozenset()) -> str:
    """A symmetric matrix over ``labels`` (host pairs): colour from the lowest value (red) to
    the highest (green), the value in each cell, ``marked`` cells outlined and titled
    "slow". Empty cells (not measured) stay blank."""
    size = max(28, min(64, 480 // max(len(labels), 1)))
    margin = 12 + 7 * max((len(str(text)) for text in labels), default=1)
    side = margin + size * len(labels) + 8
    values = list(cells.values())
    low, high = (min(values), max(values)) if values else (0.0, 1.0)
    out = [f'<svg role="img" data-plot="{esc(name)}" aria-label="{esc(title)}" '
           f'viewBox="0 0 {side} {side}" width="{side}" height="{side}" '
           f'xmlns="http://www.w3.org/2000/svg"><title>{esc(title)}</title>']
    for i, text in enumerate(labels):
        centre = margin + size * i + size / 2
        out.append(f'<text class="tick" x="{margin - 6}" y="{centre + 4:.1f}" '
                   f'text-anchor="end">{esc(text)}</text>')
        out.append(f'<text class="tick" x="{centre:.1f}" y="{margin - 6}" '
                   f'text-anchor="middle">{esc(text)}</text>')
    for (i, j), value in sorted(cells.items()):
        for a, b in {(i, j), (j, i)}:
            share = (value - low) / (high - low) if high > low else 1.0
            fill = f"hsl({120 * share:.0f}, 70%, 55%)"
            slow = (i, j) in marked or (j, i) in marked
            text = f"{labels[i]} - {labels[j]}: {value:.3g} {unit}" + (" (slow)" if slow else "")
            out.append(f'<g class="cell{" slow" if slow else ""}" data-pair="{esc(labels[i])}-'
                       f'{esc(labels[j])}"><rect x="{margin + size * b}" y="{margin + size * a}" '
                       f'width="{size}" height="{size}" fill="{fill}"/><title>{esc(text)}</title>'
                       f'<text x="{margin + size * b + size / 2}" y="{margin + size * a + size / 2 + 4}"'
                       f' text-anchor="middle" class="value">{value:.2g}</text></g>')
    out.append("</svg>")
    return "".join(out)
