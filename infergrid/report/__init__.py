"""``infergrid report``: GPU-hours held against GPU-hours used, per namespace, service and GPU
model, over a window of the device plugin's and the engines' metrics; with what whole-GPU
allocation would have held, tokens per GPU-hour and cost; as a table, JSON or an HTML page.

``series`` is the recorded file (a saved Prometheus answer) and ``prometheus`` the edge
that reads one from a Prometheus; ``readings`` turns series into holders, utilisation and
tokens, and ``compute`` does the arithmetic (pure, documented there); ``prices`` is the
price table; ``table``, ``document`` and ``page`` render, from one list of ``columns``.

One call each, for a program (the local cluster's demo)::

    report = report_from_prometheus("http://127.0.0.1:9090", start, end, step=60)
    print(render_table(report))
    Path("report.html").write_text(render_html(report))
"""

from __future__ import annotations

from pathlib import Path

from infergrid.report.compute import compute_report
from infergrid.report.document import render_json, to_json
from infergrid.report.page import render_html
from infergrid.report.prices import PriceTable, load_prices
from infergrid.report.prometheus import read_prometheus
from infergrid.report.rows import Point, Report, Row
from infergrid.report.series import Recording, read_recording, write_recording
from infergrid.report.table import render_table

__all__ = [
    "Point", "PriceTable", "Recording", "Report", "Row", "compute_report", "load_prices",
    "read_prometheus", "read_recording", "render_html", "render_json", "render_table",
    "report_from_prometheus", "report_from_recording", "to_json", "write_recording",
]  # fmt: skip


def report_from_prometheus(
    url: str, start: float, end: float, step: float, prices: PriceTable | None = None
) -> Report:
    """The report over [start, end] (Unix seconds), read from the Prometheus at ``url`` every
    ``step`` seconds, priced by ``prices`` (the built-in table when None)."""
    return compute_report(read_prometheus(url, start, end, step), prices or load_prices())


def report_from_recording(path: str | Path, prices: PriceTable | None = None) -> Report:
    """The report of a recorded file (``infergrid report --record``)."""
    return compute_report(read_recording(path), prices or load_prices())
