"""An engine's load as its Prometheus /metrics tells it, read the same way by every reader.

The operator's autoscaler reads queue depth, GPU utilisation and the latency histogram; the
gateway reads queue depth and running sequences to pick the least loaded pod. Each serving
runtime names those series its own way (`vllm:num_requests_waiting`,
`llamacpp:requests_deferred`, ...): a `MetricNames` says which series means what, and every
runtime's /metrics is read into the same `EngineSample` (infergrid/runtimes.py holds each
runtime's names). The engine image is the tenant's choice, so a body is untrusted: readers
read at most MAX_METRICS_BYTES of it, and parse it off their event loop. Parsing is pure.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Final

from prometheus_client.parser import text_string_to_metric_families

from infergrid.constants import (
    METRIC_ENGINE_E2E_LATENCY,
    METRIC_ENGINE_GPU_UTILIZATION,
    METRIC_ENGINE_KV_USAGE,
    METRIC_ENGINE_QUEUE_DEPTH,
    METRIC_ENGINE_RUNNING,
)


@dataclass(frozen=True, slots=True)
class MetricNames:
    """The series of one runtime that mean what the readers read; None: it has none. Gauges
    are summed over their series (a runtime may label them per model); GPU utilisation is
    averaged; `latency` names an end-to-end latency histogram in seconds."""

    queue_depth: str
    running: str
    latency: str | None = None
    gpu_utilization: str | None = None
    kv_usage: str | None = None  # the KV cache's used fraction, 0..1


INFERGRID_METRICS: Final = MetricNames(
    queue_depth=METRIC_ENGINE_QUEUE_DEPTH,
    running=METRIC_ENGINE_RUNNING,
    latency=METRIC_ENGINE_E2E_LATENCY,
    gpu_utilization=METRIC_ENGINE_GPU_UTILIZATION,
    kv_usage=METRIC_ENGINE_KV_USAGE,
)

# An engine's /metrics is a few KiB; a body over this is refused, never held or parsed.
MAX_METRICS_BYTES: Final = 1 << 20

# (upper bound in seconds, cumulative count), ascending by bound, +Inf last.
Buckets = tuple[tuple[float, float], ...]


@dataclass(frozen=True, slots=True)
class EngineSample:
    """One pod's scrape; a metric the engine does not export is None."""

    queue_depth: float | None = None
    gpu_utilization: float | None = None
    latency: Buckets = ()
    running: float | None = None
    kv_usage: float | None = None

    @property
    def requests_held(self) -> float | None:
        """What the engine is working on or has waiting: running sequences plus queue."""
        if self.queue_depth is None and self.running is None:
            return None
        return (self.queue_depth or 0.0) + (self.running or 0.0)


def parse_engine_metrics(text: str, names: MetricNames = INFERGRID_METRICS) -> EngineSample:
    """Queue depth, running requests and KV-cache use (each summed over its series), GPU
    utilisation (mean over GPUs), latency buckets, under the series `names` gives.

    Raises ValueError on text that is not the Prometheus exposition format.
    """
    gauges: dict[str, list[float]] = defaultdict(list)
    buckets: dict[float, float] = defaultdict(float)
    wanted = {names.queue_depth, names.running, names.gpu_utilization, names.kv_usage} - {None}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if family.name == names.latency and sample.name.endswith("_bucket"):
                buckets[float(sample.labels["le"])] += sample.value
            elif family.name in wanted:
                gauges[family.name].append(sample.value)

    def total(name: str | None) -> float | None:
        values = gauges.get(name) if name else None
        return sum(values) if values else None

    gpu = gauges.get(names.gpu_utilization) if names.gpu_utilization else None
    return EngineSample(
        queue_depth=total(names.queue_depth),
        gpu_utilization=sum(gpu) / len(gpu) if gpu else None,
        latency=tuple(sorted(buckets.items())),
        running=total(names.running),
        kv_usage=total(names.kv_usage),
    )
