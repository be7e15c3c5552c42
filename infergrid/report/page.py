"""The report as one self-contained HTML page: no script, no font and no file from anywhere
else, so it opens from disk, offline, and can be mailed.

Every number sits in an element a test (or a scraper) can find: the total's in
``#total-<column>`` (``#total-held-gpu-hours``) and ``#total-saved-gpu-hours``; each row is a
``tr.report-row`` with ``data-namespace``, ``data-service`` and ``data-model``, whose cells
have the column's class (``td.held-gpu-hours``); the plots are ``svg#plot-gpus-over-time``,
``svg#plot-utilization-over-time`` and ``svg#plot-gpu-hours-by-service``, whose bars carry
``data-label``, ``data-series`` and ``data-value``. Classes and keys are ``columns.COLUMNS``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Final

from infergrid.report.columns import COLUMNS, SAVINGS, Column
from infergrid.report.markup import tag, text
from infergrid.report.rows import Report, Row
from infergrid.report.svg import Plotted, bar_chart, line_chart
from infergrid.report.table import notes
from infergrid.report.when import show_time

_SHOWN: Final = ("held_gpu_hours", "whole_gpu_hours", "used_gpu_hours", "utilization_pct",
                 "tokens_per_gpu_hour", "cost_held", "cost_whole")  # fmt: skip
# The total's figures at the top of the page: its main columns, then what sharing saved.
_FIGURES: Final = (*(c for c in COLUMNS if c.key in _SHOWN), *SAVINGS)
_STYLE: Final = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 2em; }
#summary { display: flex; flex-wrap: wrap; gap: 0.75em; padding: 0; }
#summary div { border: 1px solid #ddd; border-radius: 6px; padding: 0.5em 0.9em; }
#summary dt { font-size: 0.8em; color: #666; } #summary dd { margin: 0; font-size: 1.3em; }
table { border-collapse: collapse; }
th, td { padding: 0.25em 0.6em; border-bottom: 1px solid #eee; }
td.number, th.number { text-align: right; font-variant-numeric: tabular-nums; }
td.model { white-space: nowrap; }
tfoot td { font-weight: bold; border-top: 2px solid #aaa; }
svg { display: block; margin: 1em 0; }
.grid { stroke: #eee; } .tick { font-size: 11px; fill: #666; }
.line { fill: none; stroke-width: 2; } text.legend { font-size: 12px; stroke: none; }
.whole { stroke: #c44e52; fill: #c44e52; } .held { stroke: #4c72b0; fill: #4c72b0; }
.used { stroke: #55a868; fill: #55a868; } .utilization { stroke: #8172b2; fill: #8172b2; }
"""


def render_html(report: Report) -> str:
    """The page: the total's figures, the table, notes, the plots and the prices."""
    title = f"InferGrid report, {show_time(report.start)} to {show_time(report.end)}"
    body = [
        tag("h1", text(title)),
        tag("p", text(notes(report)[0]), id="window", data_start=report.start,
            data_end=report.end, data_step=report.step),
        _summary(report.total),
        tag("h2", "By namespace, service and GPU model"),
        _table(report),
        tag("ul", *(tag("li", text(line)) for line in notes(report)[1:]), id="notes"),
        tag("h2", "Over time"),
        *_timeline(report),
        tag("h2", "GPU-hours by service: whole GPUs (before) and shared (after)"),
        _by_service(report),
        tag("h2", "Prices per GPU-hour"),
        _prices(report),
    ]  # fmt: skip
    head = tag("head", '<meta charset="utf-8">', tag("title", text(title)), tag("style", _STYLE))
    return "<!DOCTYPE html>\n" + tag("html", head, tag("body", *body), lang="en") + "\n"


def _summary(total: Row) -> str:
    figures = [
        tag("div", tag("dt", text(c.label)),
            tag("dd", text(c.shown(total)), id=f"total-{c.css_class}"))
        for c in _FIGURES
    ]  # fmt: skip
    return tag("dl", *figures, id="summary")


def _table(report: Report) -> str:
    head = tag("tr", *(tag("th", text(c.label), class_=_cell_class(c)) for c in COLUMNS))
    rows = [
        tag("tr", *_cells(row), class_="report-row", data_namespace=row.namespace,
            data_service=row.service, data_model=row.model)
        for row in report.rows
    ]  # fmt: skip
    total = tag("tr", *_cells(report.total), class_="total-row")
    return tag("table", tag("thead", head), tag("tbody", *rows), tag("tfoot", total), id="rows")


def _cells(row: Row) -> list[str]:
    return [tag("td", text(c.shown(row)), class_=_cell_class(c)) for c in COLUMNS]


def _cell_class(column: Column) -> str:
    return column.css_class + (" number" if column.digits is not None else "")


def _timeline(report: Report) -> list[str]:
    times = [p.time for p in report.timeline]
    gpus = line_chart("plot-gpus-over-time", "GPUs over time", times, [
        Plotted("GPUs with whole GPUs", "whole", [p.whole_gpus for p in report.timeline]),
        Plotted("GPUs held", "held", [p.held_gpus for p in report.timeline]),
        Plotted("GPUs used", "used", [p.used_gpus for p in report.timeline]),
    ])  # fmt: skip
    utilization = line_chart("plot-utilization-over-time", "Utilisation over time, %", times, [
        Plotted("utilisation of GPUs held, %", "utilization",
                [p.utilization_pct for p in report.timeline]),
    ])  # fmt: skip
    return [gpus, utilization]


def _by_service(report: Report) -> str:
    held: dict[str, float] = defaultdict(float)
    whole: dict[str, float] = defaultdict(float)
    for row in report.rows:
        held[f"{row.namespace}/{row.service}"] += row.held_gpu_hours
        whole[f"{row.namespace}/{row.service}"] += row.whole_gpu_hours
    labels = sorted(held)
    return bar_chart("plot-gpu-hours-by-service", "GPU-hours by service", labels, [
        Plotted("before: whole GPUs", "whole", [whole[label] for label in labels]),
        Plotted("after: shared", "held", [held[label] for label in labels]),
    ])  # fmt: skip


def _prices(report: Report) -> str:
    prices = report.prices
    models = sorted({r.model for r in report.rows if r.price_per_gpu_hour is not None})
    rows = [
        tag("tr", tag("td", text(model)),
            tag("td", f"{prices.price(model):.2f}", class_="price number"),
            tag("td", "table" if prices.names(model) else "default"),
            class_="price-row", data_model=model)
        for model in models
    ]  # fmt: skip
    head = tag("tr", tag("th", "GPU model"), tag("th", "$ per GPU-hour"), tag("th", "from"))
    caption = tag("caption", text(f"{prices.source}; default ${prices.default:.2f}"))
    return tag("table", caption, tag("thead", head), tag("tbody", *rows), id="prices")
