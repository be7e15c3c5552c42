"""The series a report is computed from, and the recorded file that holds them.

A recording is Prometheus' own answer kept: each series is an item of a ``query_range``
answer's ``data.result`` (``{"metric": {labels}, "values": [[t, "v"], ...]}``), and the
file wraps them with the window they were read over::

    {"schema": "infergrid.io/report-series/v1", "start": 1700000000, "end": 1700003600,
     "step": 60, "series": [{"metric": {"__name__": "...", ...}, "values": [[t, "v"], ...]}]}

Times are Unix seconds. ``__name__`` says which metric a series is (the three below); a series
of another metric is ignored, so a saved answer of a wider query still reads.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from infergrid.codec import each, expect, field, join, reject_unknown
from infergrid.errors import ContractError

SCHEMA: Final = "infergrid.io/report-series/v1"
# The series a report reads, as the device plugin and the bundled engine export them (a test
# holds these to the parts' own instruments).
HELD: Final = "infergrid_device_plugin_gpu_held_ratio"
UTILIZATION: Final = "infergrid_device_plugin_gpu_utilization_percent"
TOKENS: Final = "infergrid_engine_generation_tokens_total"
METRICS: Final = (HELD, UTILIZATION, TOKENS)
MIN_STEP_S: Final = 0.001
_FIELDS: Final = ("schema", "start", "end", "step", "series")


@dataclass(frozen=True, slots=True)
class Series:
    """One series: its labels, and its samples as (time, value) in time order."""

    labels: Mapping[str, str]
    samples: tuple[tuple[float, float], ...]

    @property
    def metric(self) -> str:
        return self.labels.get("__name__", "")


@dataclass(frozen=True, slots=True)
class Recording:
    """The series read over the window [start, end], sampled every ``step`` seconds; ``source``
    names where they were read, in errors about them."""

    start: float
    end: float
    step: float
    series: tuple[Series, ...]
    source: str = ""

    def of(self, metric: str) -> list[tuple[Series, str]]:
        """The series of one metric, each with its path (for errors)."""
        where = join(self.source, "series")
        return [(s, join(where, i)) for i, s in enumerate(self.series) if s.metric == metric]


def check_window(start: float, end: float, step: float, path: str = "") -> None:
    """A window a report can be computed over: it ends after it starts, in steps of at least
    a millisecond (Prometheus' resolution)."""
    if not step >= MIN_STEP_S:
        raise ContractError(join(path, "step"), f"must be at least {MIN_STEP_S} s, got {step:g}")
    if not end > start:
        raise ContractError(join(path, "end"), f"must be after start ({start:g}), got {end:g}")


def parse_series(item: Mapping[str, Any], path: str, start: float, end: float) -> Series:
    """One item of ``data.result``: string labels, and samples inside the window, in order."""
    reject_unknown(item, ("metric", "values"), path)
    labels = field(item, "metric", dict, path)
    for key, value in labels.items():
        if not isinstance(value, str):
            raise ContractError(join(join(path, "metric"), key), "a label value must be a string")
    samples: list[tuple[float, float]] = []
    for pair, where in each(item, "values", list, path):
        time, value = _sample(pair, where, start, end)
        if samples and time <= samples[-1][0]:
            before = samples[-1][0]
            raise ContractError(
                join(where, 0), f"time {time:g} is not after the one before ({before:g})"
            )
        samples.append((time, value))
    return Series(labels=dict(labels), samples=tuple(samples))


def _sample(pair: list[Any], path: str, start: float, end: float) -> tuple[float, float]:
    """``[t, "v"]``: a time inside the window and a finite value, written as Prometheus does."""
    if len(pair) != 2:
        raise ContractError(path, f'expected [time, "value"], got {len(pair)} items')
    time = _number(pair[0], join(path, 0))
    if not start <= time <= end:
        raise ContractError(
            join(path, 0), f"time {time:g} is outside the window [{start:g}, {end:g}]"
        )
    text = expect(pair[1], str, join(path, 1))
    try:
        value = float(text)
    except ValueError:
        raise ContractError(join(path, 1), f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise ContractError(join(path, 1), f"{text!r} is not a finite number")
    return time, value


def _seconds(doc: Mapping[str, Any], key: str, path: str) -> float:
    if key not in doc:
        raise ContractError(join(path, key), "is required")
    return _number(doc[key], join(path, key))


def _number(value: object, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ContractError(path, f"expected a finite number of seconds, got {value!r}")
    return float(value)


def parse_recording(doc: object, path: str) -> Recording:
    """A recording document (see the module); ``path`` names the file in errors."""
    doc = expect(doc, dict, path)
    reject_unknown(doc, _FIELDS, path)
    schema = field(doc, "schema", str, path)
    if schema != SCHEMA:
        raise ContractError(
            join(path, "schema"), f"unsupported {schema!r}; this build reads {SCHEMA!r}"
        )
    start, end, step = (_seconds(doc, key, path) for key in ("start", "end", "step"))
    check_window(start, end, step, path)
    series = tuple(
        parse_series(item, where, start, end) for item, where in each(doc, "series", dict, path)
    )
    return Recording(start=start, end=end, step=step, series=series, source=path)


def read_recording(path: str | Path) -> Recording:
    """The recording in the file ``path``. Read as JSON, not through ``read_yaml``: a week's
    recording runs to many megabytes, which the YAML parser reads a hundred times slower."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ContractError(
            str(path), f"cannot read: {getattr(error, 'strerror', None) or error}"
        ) from None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise ContractError(str(path), f"not valid JSON: {error}") from None
    return parse_recording(doc, str(path))


def recording_json(recording: Recording) -> dict[str, Any]:
    """The recording as its document: values written back as Prometheus writes them."""
    return {
        "schema": SCHEMA,
        "start": recording.start,
        "end": recording.end,
        "step": recording.step,
        "series": [
            {"metric": dict(s.labels), "values": [[t, _prometheus_text(v)] for t, v in s.samples]}
            for s in recording.series
        ],
    }


def write_recording(recording: Recording, path: str | Path) -> None:
    """Save ``recording`` so a report can be computed again from it (``--recorded``)."""
    try:
        Path(path).write_text(json.dumps(recording_json(recording)) + "\n", encoding="utf-8")
    except OSError as error:
        raise ContractError(str(path), f"cannot write: {error.strerror or error}") from None


def _prometheus_text(value: float) -> str:
    """ "1" for 1.0, as Prometheus formats a sample, so a recording reads back equal."""
    return repr(int(value)) if value.is_integer() else repr(value)
