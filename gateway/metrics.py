"""The gateway's Prometheus metrics, on their own registry and listener.

Labels are bounded by what the operator of the cluster writes, never by what a client
sends: `model` is a served model (a request for another one is counted by reason only), `tenant`
a tenant of the keys Secret, `track` stable or canary.
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from infergrid.constants import METRIC_GATEWAY_PENDING

PREFIX: Final = "infergrid_gateway_"
LATENCY_BUCKETS: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300,
)  # fmt: skip


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        per_request = ["model", "track", "tenant"]
        self.requests = Counter(
            PREFIX + "requests", "Requests forwarded to an engine, by its answer's status.",
            [*per_request, "code"], registry=r,
        )  # fmt: skip
        self.latency = Histogram(
            PREFIX + "request_duration_seconds",
            "Time from the request's arrival to the answer's last byte, hold included.",
            per_request, buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.ttft = Histogram(
            PREFIX + "time_to_first_token_seconds",
            "Time from a streamed request's arrival to its first event.",
            per_request, buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.refused = Counter(
            PREFIX + "refused",
            "Requests answered by the gateway itself: unauthorized (401), rate_limited (429), "
            "unknown_model (404), bad_request (4xx), hold_full (429), hold_timeout (503).",
            ["reason", "tenant"], registry=r,
        )  # fmt: skip
        self.upstream_errors = Counter(
            PREFIX + "upstream_errors",
            "Engine pods that failed a request: connect (retried elsewhere) or mid_answer.",
            ["model", "track", "kind"], registry=r,
        )  # fmt: skip
        self.pending = Gauge(
            METRIC_GATEWAY_PENDING,
            "Requests held for a service with no ready pod; the operator scales on them.",
            ["namespace", "service"], registry=r,
        )  # fmt: skip
        self.in_flight = Gauge(
            PREFIX + "in_flight_requests", "Requests forwarded and not yet answered, by model.",
            ["model"], registry=r,
        )  # fmt: skip
        self.scale_ups = Counter(
            PREFIX + "scale_ups", "Services at zero replicas asked for one.",
            ["namespace", "service"], registry=r,
        )  # fmt: skip

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
