"""Two plots as inline SVG, drawn here with no plotting library: lines over time, and bars in
groups. Every mark carries its series (and a bar its value) as attributes, so the page's
numbers can be read back from its DOM; colours come from the page's CSS, by each series'
class."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from infergrid.report.markup import tag, text
from infergrid.report.when import show_time

WIDTH: Final = 760
HEIGHT: Final = 280
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 28, 56
PLOT_WIDTH: Final = WIDTH - LEFT - RIGHT
PLOT_HEIGHT: Final = HEIGHT - TOP - BOTTOM
GRID_LINES: Final = 4
LEGEND_SPACING: Final = 190


@dataclass(frozen=True, slots=True)
class Plotted:
    """A named series of values (None: not known there), drawn with the CSS class ``css``."""

    name: str
    css: str
    values: Sequence[float | None]


def line_chart(
    element_id: str, title: str, times: Sequence[float], lines: Sequence[Plotted]
) -> str:
    """Lines over ``times`` (Unix seconds); a line breaks where its value is not known."""
    top = nice_top([v for line in lines for v in line.values if v is not None])
    span = (times[-1] - times[0]) or 1.0
    x = [LEFT + (t - times[0]) / span * PLOT_WIDTH for t in times]
    marks = [
        tag("polyline", class_=f"line {line.css}", data_series=line.name,
            points=" ".join(f"{px:.1f},{py:.1f}" for px, py in segment))
        for line in lines
        for segment in _segments(x, line.values, top)
    ]  # fmt: skip
    ticks = [(x[i], show_time(times[i])[11:16]) for i in sorted({0, len(x) // 2, len(x) - 1})]
    return _svg(element_id, title, top, marks, ticks, lines)


def bar_chart(element_id: str, title: str, labels: Sequence[str], bars: Sequence[Plotted]) -> str:
    """A group of bars per label, one bar per series, side by side."""
    top = nice_top([v for bar in bars for v in bar.values if v is not None])
    group = PLOT_WIDTH / max(len(labels), 1)
    width = group * 0.8 / max(len(bars), 1)
    marks = []
    for i, label in enumerate(labels):
        for j, bar in enumerate(bars):
            value = bar.values[i] or 0.0
            height = value / top * PLOT_HEIGHT
            marks.append(tag(
                "rect", tag("title", text(f"{label}, {bar.name}: {value:.3f}")),
                class_=f"bar {bar.css}", data_label=label, data_series=bar.name,
                data_value=f"{value:.3f}", x=f"{LEFT + i * group + group * 0.1 + j * width:.1f}",
                y=f"{TOP + PLOT_HEIGHT - height:.1f}", width=f"{width:.1f}", height=f"{height:.1f}",
            ))  # fmt: skip
    ticks = [(LEFT + (i + 0.5) * group, label) for i, label in enumerate(labels)]
    return _svg(element_id, title, top, marks, ticks, bars)


def nice_top(values: Sequence[float]) -> float:
    """The axis' top: the least of 1, 2, 2.5 or 5 times a power of ten at or above every value."""
    highest = max(values, default=0.0)
    if highest <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(highest))
    return next(f * power for f in (1, 2, 2.5, 5, 10) if f * power >= highest)


def _segments(
    x: Sequence[float], values: Sequence[float | None], top: float
) -> list[list[tuple[float, float]]]:
    """The runs of known values, as points on the plot."""
    segments: list[list[tuple[float, float]]] = [[]]
    for px, value in zip(x, values, strict=True):
        if value is None:
            segments.append([])
        else:
            segments[-1].append((px, TOP + (1 - value / top) * PLOT_HEIGHT))
    return [s for s in segments if s]


def _svg(
    element_id: str,
    title: str,
    top: float,
    marks: list[str],
    ticks: list[tuple[float, str]],
    series: Sequence[Plotted],
) -> str:
    """The frame around ``marks``: horizontal grid with its values, ``ticks`` under the plot
    (x, label), and a legend naming each series."""
    below = TOP + PLOT_HEIGHT + 18
    parts = []
    for k in range(GRID_LINES + 1):
        y = f"{TOP + PLOT_HEIGHT * (1 - k / GRID_LINES):.1f}"
        parts.append(tag("line", class_="grid", x1=LEFT, x2=WIDTH - RIGHT, y1=y, y2=y))
        value = text(f"{top * k / GRID_LINES:g}")
        parts.append(tag("text", value, class_="tick", x=LEFT - 6, y=y, text_anchor="end"))
    parts += [
        tag("text", text(label), class_="tick", x=f"{px:.1f}", y=below, text_anchor="middle")
        for px, label in ticks
    ]
    parts += [
        tag("text", "&#9632; " + text(s.name), class_=f"legend {s.css}",
            x=LEFT + LEGEND_SPACING * i, y=HEIGHT - 8)
        for i, s in enumerate(series)
    ]  # fmt: skip
    return tag(
        "svg", tag("title", text(title)), *parts, *marks,
        id=element_id, xmlns="http://www.w3.org/2000/svg", viewBox=f"0 0 {WIDTH} {HEIGHT}",
        width=WIDTH, height=HEIGHT, role="img", aria_label=title,
    )  # fmt: skip
