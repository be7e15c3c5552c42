"""Reading an engine's /metrics: queue depth, GPU utilisation and the latency histogram, as
every reader (the operator's autoscaler, the gateway) reads them."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest

from infergrid.constants import (
    METRIC_ENGINE_E2E_LATENCY,
    METRIC_ENGINE_GPU_UTILIZATION,
    METRIC_ENGINE_QUEUE_DEPTH,
    METRIC_ENGINE_RUNNING,
)
from infergrid.engine_metrics import EngineSample, parse_engine_metrics

BOUNDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def engine_text(queue=3, gpus=(50, 70), latencies=()) -> str:
    """What an engine exports, written by prometheus_client itself."""
    registry = CollectorRegistry()
    Gauge(METRIC_ENGINE_QUEUE_DEPTH, "waiting", registry=registry).set(queue)
    util = Gauge(METRIC_ENGINE_GPU_UTILIZATION, "util", ["gpu"], registry=registry)
    for i, value in enumerate(gpus):
        util.labels(str(i)).set(value)
    histogram = Histogram(METRIC_ENGINE_E2E_LATENCY, "e2e", buckets=BOUNDS, registry=registry)
    for seconds in latencies:
        histogram.observe(seconds)
    return generate_latest(registry).decode()


def test_parses_queue_depth_mean_gpu_utilisation_and_buckets():
    sample = parse_engine_metrics(engine_text(queue=3, gpus=(50, 70), latencies=[0.07, 0.3]))
    assert sample.queue_depth == 3
    assert sample.gpu_utilization == 60
    assert dict(sample.latency) == {0.05: 0, 0.1: 1, 0.25: 1, 0.5: 2, 1.0: 2, 2.5: 2,
                                    float("inf"): 2}  # fmt: skip


def test_queue_depth_is_summed_over_its_series():
    text = (
        f"# TYPE {METRIC_ENGINE_QUEUE_DEPTH} gauge\n"
        f'{METRIC_ENGINE_QUEUE_DEPTH}{{rank="0"}} 2\n{METRIC_ENGINE_QUEUE_DEPTH}{{rank="1"}} 5\n'
    )
    assert parse_engine_metrics(text) == EngineSample(queue_depth=7)


def test_metrics_an_engine_does_not_export_are_none():
    sample = parse_engine_metrics("# TYPE other gauge\nother 1\n")
    assert sample == EngineSample() and sample.requests_held is None


def test_the_requests_an_engine_holds_are_its_running_sequences_and_its_queue():
    text = (
        f"# TYPE {METRIC_ENGINE_QUEUE_DEPTH} gauge\n{METRIC_ENGINE_QUEUE_DEPTH} 2\n"
        f"# TYPE {METRIC_ENGINE_RUNNING} gauge\n{METRIC_ENGINE_RUNNING} 4\n"
    )
    sample = parse_engine_metrics(text)
    assert (sample.running, sample.requests_held) == (4, 6)


def test_the_engine_exports_the_gauges_readers_parse():
    from batching_engine.metrics import EngineMetrics

    metrics = EngineMetrics()
    metrics.track_state(lambda: 3, lambda: 2, lambda: 0.5)
    sample = parse_engine_metrics(metrics.exposition().decode())
    assert (sample.queue_depth, sample.running) == (3, 2)


def test_text_that_is_not_prometheus_is_a_value_error():
    with pytest.raises(ValueError):
        parse_engine_metrics("{not: prometheus}\n")
