"""The report as text: a row per namespace, service and GPU model, the total, and what sharing
saved against whole GPUs. Columns are ``columns.COLUMNS``."""

from __future__ import annotations

from collections.abc import Sequence

from infergrid.report.columns import COLUMNS, SAVINGS
from infergrid.report.rows import NO_GPU, NO_SERVICE, Report
from infergrid.report.when import show_duration, show_time


def render_table(report: Report) -> str:
    """The report as an aligned text table with a few lines of context under it."""
    rows = [
        tuple(c.heading for c in COLUMNS),
        *(tuple(c.shown(row) for c in COLUMNS) for row in report.rows),
        tuple(c.shown(report.total) for c in COLUMNS),
    ]
    return "\n".join([_columns(rows), *notes(report)])


def notes(report: Report) -> list[str]:
    """The lines under the table: the window, the saving, the prices, what "-" means."""
    total, prices = report.total, report.prices
    saved_hours, saved_pct, saved_cost = (c.shown(total) for c in SAVINGS)
    lines = [
        f"window {show_time(report.start)} to {show_time(report.end)} "
        f"({show_duration(report.end - report.start)}), read every {show_duration(report.step)}",
        f"sharing held {total.held_gpu_hours:.3f} GPU-hours where whole GPUs would have held "
        f"{total.whole_gpu_hours:.3f}: {saved_hours} GPU-hours ({saved_pct}%) and "
        f"${saved_cost} saved",
        f"prices per GPU-hour: {prices.source}",
    ]
    models = {r.model for r in report.rows if r.model != NO_GPU}
    if defaulted := sorted(m for m in models if not prices.names(m)):
        lines.append(f"priced at the default ${prices.default:.2f}: {', '.join(defaulted)}")
    if any(r.service == NO_SERVICE for r in report.rows):
        lines.append(f'service "{NO_SERVICE}": pods that held a GPU and have no engine series')
    if any(r.model == NO_GPU for r in report.rows):
        lines.append(f'GPU model "{NO_GPU}": engine pods that held no GPU')
    return lines


def _columns(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )
