"""``infergrid report``: GPU-hours held against GPU-hours used, per namespace, service and GPU
model, with what whole-GPU allocation would have held, tokens per GPU-hour and cost.

    infergrid report --prometheus http://127.0.0.1:9090 --window 1h --html report.html
    infergrid report --prometheus URL --start 2025-06-01T00:00:00Z --end 2025-06-02T00:00:00Z
    infergrid report --recorded run.json --json

It reads the device plugin's infergrid_device_plugin_gpu_held_ratio and
..._gpu_utilization_percent and the engines' infergrid_engine_generation_tokens_total, from
a Prometheus or from a file --record saved. The table (or --json) goes to stdout; --html
also writes the page with its plots. docs/operations.md says how each column is computed.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from infergrid.errors import ContractError
from infergrid.report.compute import compute_report
from infergrid.report.document import render_json
from infergrid.report.page import render_html
from infergrid.report.prices import load_prices
from infergrid.report.prometheus import read_prometheus
from infergrid.report.series import Recording, read_recording, write_recording
from infergrid.report.table import render_table
from infergrid.report.when import parse_duration, parse_time

DEFAULT_WINDOW: Final = "1h"
DEFAULT_STEP: Final = "60s"
_WINDOW_FLAGS: Final = ("window", "start", "end", "step")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The subcommand's flags, on the parser ``infergrid`` gives it."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--prometheus", metavar="URL", help="the Prometheus to read, e.g. http://127.0.0.1:9090"
    )
    source.add_argument(
        "--recorded", metavar="FILE", help="read the series from FILE (--record saves one)"
    )
    parser.add_argument(
        "--window",
        metavar="DURATION",
        help=f"the window ending at --end (default {DEFAULT_WINDOW})",
    )
    parser.add_argument(
        "--start", metavar="TIME", help="RFC 3339 or Unix seconds, instead of --window"
    )
    parser.add_argument("--end", metavar="TIME", help="RFC 3339 or Unix seconds (default now)")
    parser.add_argument(
        "--step", metavar="DURATION", help=f"read every DURATION (default {DEFAULT_STEP})"
    )
    parser.add_argument(
        "--prices", metavar="FILE", help="price per GPU-hour by GPU model (YAML or JSON)"
    )
    parser.add_argument("--json", action="store_true", help="print the JSON report")
    parser.add_argument("--html", metavar="FILE", help="also write the HTML page with its plots")
    parser.add_argument("--record", metavar="FILE", help="also save the series read, to replay")


def run(args: argparse.Namespace, now: Callable[[], float] = time.time) -> str:
    """The report the flags ask for, as text or JSON, once it has written the files asked for."""
    prices = load_prices(args.prices)
    recording = _recording(args, now)
    if args.record:
        write_recording(recording, args.record)
    report = compute_report(recording, prices)
    if args.html:
        try:
            Path(args.html).write_text(render_html(report), encoding="utf-8")
        except OSError as error:
            raise ContractError(
                "html", f"cannot write {args.html}: {error.strerror or error}"
            ) from None
    return render_json(report) if args.json else render_table(report)


def _recording(args: argparse.Namespace, now: Callable[[], float]) -> Recording:
    if args.recorded:
        for flag in _WINDOW_FLAGS:
            if getattr(args, flag) is not None:
                raise ContractError(
                    flag, "a recording has its own window; leave it out with --recorded"
                )
        return read_recording(args.recorded)
    start, end = window(args.window, args.start, args.end, now())
    step = parse_duration(args.step or DEFAULT_STEP, "step")
    return read_prometheus(args.prometheus, start, end, step)


def window(
    length: str | None, start: str | None, end: str | None, now: float
) -> tuple[float, float]:
    """[start, end] in Unix seconds: ``--start`` to ``--end``, or ``--window`` ending at
    ``--end``; the end is now (to the second) unless given."""
    if start is not None and length is not None:
        raise ContractError("window", "give --window or --start, not both")
    last = parse_time(end, "end") if end is not None else float(int(now))
    first = (
        parse_time(start, "start")
        if start is not None
        else last - parse_duration(length or DEFAULT_WINDOW, "window")
    )
    if not last > first:
        raise ContractError("end", f"must be after the start ({first:g}), got {last:g}")
    return first, last
