"""The report as JSON (``infergrid report --json``)::

    {
      "schema": "infergrid.io/report/v1",
      "window": {"start": float, "end": float, "step": float},   # Unix seconds
      "rows": [ROW],
      "total": ROW + {"saved_gpu_hours": float, "saved_pct": float | null,
                      "saved_cost": float},
      "timeline": [{"time": float, "held_gpus": float, "whole_gpus": float,
                    "used_gpus": float, "utilization_pct": float | null}],
      "prices": {"source": str, "default": float, "per_gpu_hour": {model: float}}
    }
    ROW = {"namespace": str, "service": str, "model": str, "pods": int,
           "held_gpu_hours": float, "whole_gpu_hours": float, "used_gpu_hours": float,
           "utilization_pct": float | null, "tokens": float,
           "tokens_per_gpu_hour": float | null, "price_per_gpu_hour": float | null,
           "cost_held": float, "cost_whole": float, "measured_gpu_hours": float}

The total's namespace, service and model are "all"; null is "not defined" (no GPU-hours to
divide by, or utilisation never read).
"""

from __future__ import annotations

import json
from typing import Any, Final

from infergrid.report.columns import COLUMNS, SAVINGS, Column
from infergrid.report.rows import Point, Report, Row

SCHEMA: Final = "infergrid.io/report/v1"
_MEASURED: Final = Column("measured_gpu_hours", "", "", 3)
_GPUS_DIGITS: Final = 6


def to_json(report: Report) -> dict[str, Any]:
    """The report as the documented JSON document."""
    return {
        "schema": SCHEMA,
        "window": {"start": report.start, "end": report.end, "step": report.step},
        "rows": [_row(row) for row in report.rows],
        "total": {**_row(report.total), **{c.key: c.rounded(report.total) for c in SAVINGS}},
        "timeline": [_point(point) for point in report.timeline],
        "prices": {
            "source": report.prices.source,
            "default": report.prices.default,
            "per_gpu_hour": dict(report.prices.per_model),
        },
    }


def render_json(report: Report) -> str:
    """The JSON text: two-space indent, keys in schema order."""
    return json.dumps(to_json(report), indent=2)


def _row(row: Row) -> dict[str, Any]:
    return {c.key: c.rounded(row) for c in (*COLUMNS, _MEASURED)}


def _point(point: Point) -> dict[str, Any]:
    utilization = point.utilization_pct
    return {
        "time": point.time,
        "held_gpus": round(point.held_gpus, _GPUS_DIGITS),
        "whole_gpus": round(point.whole_gpus, _GPUS_DIGITS),
        "used_gpus": round(point.used_gpus, _GPUS_DIGITS),
        "utilization_pct": None if utilization is None else round(utilization, _GPUS_DIGITS),
    }
