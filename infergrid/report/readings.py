"""The recorded series read into what the report's arithmetic needs: who holds which GPU at each
step, each GPU's utilisation at each step, and each engine pod's service and tokens.

Times become whole milliseconds (Prometheus' own resolution), so that a step's samples of
different series meet on one key. A series scraped twice (two jobs over one target) would
repeat a fact: the holder and utilisation readings keep the larger value, never the sum.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from itertools import pairwise

from infergrid.errors import ContractError
from infergrid.report.series import HELD, TOKENS, UTILIZATION, Recording, Series

Pod = tuple[str, str]  # (namespace, name)
Gpu = tuple[str, str]  # (model, uuid)
Holdings = dict[int, dict[Pod, dict[Gpu, float]]]  # time (ms) -> pod -> GPU -> fraction held


def ms(seconds: float) -> int:
    return round(seconds * 1000)


def label(series: Series, name: str, path: str) -> str:
    """A label the report needs. Where Prometheus renamed it ``exported_<name>`` (a scrape that
    does not honour the target's labels), that one is the device plugin's and is read."""
    value = series.labels.get(f"exported_{name}") or series.labels.get(name)
    if not value:
        raise ContractError(f"{path}.metric.{name}", f"is required on {series.metric}")
    return value


def holdings(recording: Recording) -> Holdings:
    """The fraction of each GPU each pod holds at each step: its containers' held ratios on
    that GPU (its MIG instances' too) added up."""
    held: dict[tuple[Pod, Gpu, str, str], dict[int, float]] = defaultdict(dict)
    for series, path in recording.of(HELD):
        pod = (label(series, "namespace", path), label(series, "pod", path))
        gpu = (label(series, "model", path), label(series, "gpu_uuid", path))
        unit = (series.labels.get("mig_uuid", ""), series.labels.get("container", ""))
        _keep_larger(held[(pod, gpu, *unit)], series.samples)
    out: Holdings = defaultdict(lambda: defaultdict(lambda: defaultdict(float)))
    for (pod, gpu, _, _), samples in held.items():
        for time, ratio in samples.items():
            out[time][pod][gpu] += ratio
    return out


def utilization(recording: Recording) -> dict[str, dict[int, float]]:
    """Each GPU's utilisation, percent, by GPU uuid and time (ms)."""
    out: dict[str, dict[int, float]] = defaultdict(dict)
    for series, path in recording.of(UTILIZATION):
        _keep_larger(out[label(series, "gpu_uuid", path)], series.samples)
    return out


def _keep_larger(into: dict[int, float], samples: Iterable[tuple[float, float]]) -> None:
    for time, value in samples:
        key = ms(time)
        into[key] = max(value, into.get(key, value))


def engine_pods(recording: Recording) -> tuple[dict[Pod, str], dict[Pod, float]]:
    """Each engine pod's InferenceService (the ``inferenceservice`` label the chart's engines
    ServiceMonitor adds) and the tokens it generated in the window."""
    services: dict[Pod, str] = {}
    tokens: dict[Pod, float] = defaultdict(float)
    for series, path in recording.of(TOKENS):
        pod = (label(series, "namespace", path), label(series, "pod", path))
        services[pod] = series.labels.get("inferenceservice") or services.get(pod, "")
        tokens[pod] += counter_increase(series.samples, recording.start)
    return services, tokens


def counter_increase(samples: tuple[tuple[float, float], ...], start: float) -> float:
    """What a counter counted over the window, as Prometheus counts it: a drop is a restart
    from 0. A series that begins after the window's start is a pod that started inside it,
    so its first value was counted from 0 too."""
    if not samples:
        return 0.0
    first_time, first = samples[0]
    total = first if ms(first_time) > ms(start) else 0.0
    for (_, before), (_, now) in pairwise(samples):
        total += now - before if now >= before else now
    return total
