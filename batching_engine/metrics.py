"""The engine's Prometheus metrics, named infergrid_engine_<thing>_<unit>.

Each engine instance owns its registry, so several engines in one process (the tests) do
not share counters. Three of these names are a contract with the operator's autoscaler
(`infergrid.constants`): queue depth, end-to-end latency and utilisation.

Utilisation is the engine's busy time (the share of the window its worker thread spent
running the model), on GPU and CPU alike. NVML's device utilisation would be the more usual
source on a GPU, but on a shared GPU it counts every tenant's kernels, and the autoscaler
must scale this service on this service's load.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from enum import StrEnum

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from batching_engine.throughput import BusyWindow
from infergrid.constants import (
    METRIC_ENGINE_E2E_LATENCY,
    METRIC_ENGINE_GPU_UTILIZATION,
    METRIC_ENGINE_KV_USAGE,
    METRIC_ENGINE_QUEUE_DEPTH,
    METRIC_ENGINE_RUNNING,
)

PREFIX = "infergrid_engine_"
BUSY_WINDOW_S = 10.0
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class RequestStatus(StrEnum):
    """The values of the `status` label of requests_total: how a request ended."""

    SUCCESS = "success"  # finished by EOS, a stop string or max_tokens
    REJECTED = "rejected"  # 429: the queue was full
    INVALID = "invalid"  # 400/404/413: the request was wrong
    ABORTED = "aborted"  # the client went away
    TIMEOUT = "timeout"  # waited in the queue past its timeout
    ERROR = "error"  # 500: our fault


class EngineMetrics:
    """Every instrument of one engine, and the few rules that turn events into samples."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._clock = clock
        self._busy = BusyWindow(BUSY_WINDOW_S)
        self._busy_lock = threading.Lock()
        self._histograms()
        self._gauges()
        self._counters()

    def _histograms(self) -> None:
        h = self._histogram
        self.ttft = h("ttft_seconds", "Time from arrival to the first output token.")
        self.tpot = h(
            "tpot_seconds",
            "Mean time per output token after the first, per request.",
            TOKEN_BUCKETS,
        )
        self.inter_token = h(
            "inter_token_latency_seconds",
            "Time between consecutive output tokens of a request.",
            TOKEN_BUCKETS,
        )
        self.e2e = h(
            METRIC_ENGINE_E2E_LATENCY.removeprefix(PREFIX),
            "Time from arrival to the last output token, of requests that finished.",
        )
        self.queue_time = h("queue_time_seconds", "Time from arrival to the first scheduled step.")
        self.batch_size = h(
            "batch_size",
            "Sequences (or inputs, for single-pass models) per model step.",
            BATCH_BUCKETS,
        )

    def _gauges(self) -> None:
        g = self._gauge
        self.queue_depth = g(
            METRIC_ENGINE_QUEUE_DEPTH.removeprefix(PREFIX),
            "Requests accepted and waiting to be scheduled (generation and single-pass).",
        )
        self.running = g(
            METRIC_ENGINE_RUNNING.removeprefix(PREFIX),
            "Sequences being generated (holding KV blocks).",
        )
        self.kv_usage = g(
            METRIC_ENGINE_KV_USAGE.removeprefix(PREFIX), "Share of KV-cache blocks in use, 0 to 1."
        )
        self.utilization = g(
            METRIC_ENGINE_GPU_UTILIZATION.removeprefix(PREFIX),
            f"Engine busy time: percent of the last {BUSY_WINDOW_S:g} s the "
            "worker spent running the model. Not NVML: the same measure on "
            "CPU and GPU, and on a shared GPU this service's load only.",
        )
        self.utilization.set_function(self.busy_percent)

    def _counters(self) -> None:
        c = self._counter
        self.requests = Counter(
            PREFIX + "requests", "Requests by outcome.", ["status"], registry=self.registry
        )
        for status in RequestStatus:
            self.requests.labels(status)  # every series present from the start, at 0
        self.prompt_tokens = c("prompt_tokens", "Prompt tokens of accepted requests.")
        self.generation_tokens = c("generation_tokens", "Output tokens generated.")
        self.preemptions = c("preemptions", "Sequences preempted (their KV dropped, recomputed).")
        self.prefix_hits = c(
            "prefix_cache_hit_tokens", "Prompt tokens found in the prefix cache, not computed."
        )
        self.prefill_tokens = c(
            "prefill_tokens",
            "Prompt tokens computed (prefix-cache hits excluded, recomputed "
            "tokens of preempted sequences included).",
        )

    # Events.

    def request_finished(self, status: RequestStatus) -> None:
        self.requests.labels(status).inc()

    def first_token(self, arrival: float, now: float) -> None:
        self.ttft.observe(now - arrival)

    def next_token(self, previous: float, now: float) -> None:
        self.inter_token.observe(now - previous)

    def scheduled(self, arrival: float, now: float) -> None:
        self.queue_time.observe(now - arrival)

    def completed(self, arrival: float, first_token: float, now: float, output_tokens: int) -> None:
        """A request finished with output: its end-to-end latency and time per output token."""
        self.e2e.observe(now - arrival)
        if output_tokens > 1:
            self.tpot.observe((now - first_token) / (output_tokens - 1))

    def step(
        self,
        *,
        batch_size: int,
        prefill_tokens: int,
        prefix_hit_tokens: int,
        preemptions: int,
        start: float,
        end: float,
    ) -> None:
        """One model step (or single-pass batch) that ran from `start` to `end`."""
        if batch_size:
            self.batch_size.observe(batch_size)
        self.prefill_tokens.inc(prefill_tokens)
        self.prefix_hits.inc(prefix_hit_tokens)
        self.preemptions.inc(preemptions)
        with self._busy_lock:
            self._busy.add(start, end)

    def track_state(
        self,
        queue_depth: Callable[[], float],
        running: Callable[[], float],
        kv_usage: Callable[[], float],
    ) -> None:
        """Gauges read when scraped, so an idle engine never shows a stale value."""
        self.queue_depth.set_function(queue_depth)
        self.running.set_function(running)
        self.kv_usage.set_function(kv_usage)

    def busy_percent(self) -> float:
        with self._busy_lock:
            return self._busy.percent(self._clock())

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    # Instruments.

    def _histogram(self, name: str, doc: str, buckets: tuple[float, ...] = LATENCY_BUCKETS):
        return Histogram(PREFIX + name, doc, buckets=buckets, registry=self.registry)

    def _gauge(self, name: str, doc: str) -> Gauge:
        return Gauge(PREFIX + name, doc, registry=self.registry)

    def _counter(self, name: str, doc: str) -> Counter:
        return Counter(PREFIX + name, doc, registry=self.registry)
