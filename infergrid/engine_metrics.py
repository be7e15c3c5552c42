"""An engine's load as its Prometheus /metrics tells it, read the same way by every reader.

The operator's autoscaler reads queue depth, GPU utilisation and the latency histogram; the
gateway reads queue depth and running sequences to pick the least loaded pod. The engine
image is the tenant's choice, so a body is untrusted: readers read at most
MAX_METRICS_BYTES of it, and parse it off their event loop. Parsing is pure.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Final

from prometheus_client.parser import text_string_to_metric_families

from infergrid.constants import (
    METRIC_ENGINE_E2E_LATENCY,
    METRIC_ENGINE_GPU_UTILIZATION,
    METRIC_ENGINE_QUEUE_DEPTH,
    METRIC_ENGINE_RUNNING,
)

_GAUGES: Final = (METRIC_ENGINE_QUEUE_DEPTH, METRIC_ENGINE_RUNNING, METRIC_ENGINE_GPU_UTILIZATION)

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

    @property
    def requests_held(self) -> float | None:
        """What the engine is working on or has waiting: running sequences plus queue."""
        if self.queue_depth is None and self.running is None:
            return None
        return (self.queue_depth or 0.0) + (self.running or 0.0)


def parse_engine_metrics(text: str) -> EngineSample:
    """Queue depth and running sequences (summed over series), GPU utilisation (mean over
    GPUs), latency buckets.

    Raises ValueError on text that is not the Prometheus exposition format.
    """
    gauges: dict[str, list[float]] = defaultdict(list)
    buckets: dict[float, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if family.name == METRIC_ENGINE_E2E_LATENCY and sample.name.endswith("_bucket"):
                buckets[float(sample.labels["le"])] += sample.value
            elif family.name in _GAUGES:
                gauges[family.name].append(sample.value)
    queue = gauges.get(METRIC_ENGINE_QUEUE_DEPTH)
    gpu = gauges.get(METRIC_ENGINE_GPU_UTILIZATION)
    running = gauges.get(METRIC_ENGINE_RUNNING)
    return EngineSample(
        queue_depth=sum(queue) if queue else None,
        gpu_utilization=sum(gpu) / len(gpu) if gpu else None,
        latency=tuple(sorted(buckets.items())),
        running=sum(running) if running else None,
    )
