"""The engines' load, read from each engine pod's Prometheus /metrics, and the requests the
gateway holds for a service, read from the gateway's.

Three numbers drive the autoscaler: queue depth per replica, P99 end-to-end
latency and GPU utilisation. Latency is a cumulative histogram, so its P99
is taken over the requests since the previous scrape (bucket deltas per pod),
not over the pod's lifetime, which would hide a new overload for hours.
A fourth is the gateway's: requests it holds for a service with no ready pod.
Parsing (`infergrid.engine_metrics` for an engine's text) and aggregation are pure;
only `scrape` and `gateway_pending` do I/O.

The engine image is the tenant's choice, so its /metrics is untrusted input: a body is
read up to MAX_METRICS_BYTES, each request has the operator's scrape timeout, and the
parsing runs in a worker thread, never on the event loop that serves every other handler.
The gateway's /metrics is read within the same bounds.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from infergrid.capped_read import read_capped
from infergrid.constants import METRIC_GATEWAY_PENDING
from infergrid.engine_metrics import (
    INFERGRID_METRICS,
    MAX_METRICS_BYTES,
    Buckets,
    EngineSample,
    MetricNames,
    parse_engine_metrics,
)

log = logging.getLogger("infergrid.operator.metrics")

OVER_CAP: Final = f"/metrics is over the {MAX_METRICS_BYTES}-byte cap"


@dataclass(frozen=True, slots=True)
class ServiceMetrics:
    """The load of a service's pods: means per pod, and P99 over the last interval."""

    pods: int
    queue_depth: float | None = None
    p99_latency_ms: float | None = None
    gpu_utilization: float | None = None


def latency_delta(now: Buckets, before: Buckets | None) -> Buckets:
    """Requests since the previous scrape; none on a pod's first scrape.

    A count that went down means the engine restarted and its counters began
    again at zero, so everything it counted since is new.
    """
    if before is None:
        return ()
    old = dict(before)
    if any(count < old.get(bound, 0.0) for bound, count in now):
        return now
    return tuple((bound, count - old.get(bound, 0.0)) for bound, count in now)


def histogram_quantile(q: float, buckets: Buckets) -> float | None:
    """The q-quantile, interpolated inside its bucket as Prometheus does; None with no data.

    A quantile that falls in the +Inf bucket is reported as the largest finite bound.
    """
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower
            inside = count - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, count
    return lower


def aggregate(
    samples: Mapping[str, EngineSample], previous: Mapping[str, Buckets]
) -> ServiceMetrics:
    """Means over the pods that export each metric; P99 over all pods' new requests."""
    queues = [s.queue_depth for s in samples.values() if s.queue_depth is not None]
    gpus = [s.gpu_utilization for s in samples.values() if s.gpu_utilization is not None]
    merged: dict[float, float] = defaultdict(float)
    for pod, sample in samples.items():
        for bound, count in latency_delta(sample.latency, previous.get(pod)):
            merged[bound] += count
    p99 = histogram_quantile(0.99, tuple(sorted(merged.items())))
    return ServiceMetrics(
        pods=len(samples),
        queue_depth=sum(queues) / len(queues) if queues else None,
        p99_latency_ms=p99 * 1000 if p99 is not None else None,
        gpu_utilization=sum(gpus) / len(gpus) if gpus else None,
    )


def scrapable(pod: Mapping) -> bool:
    """Running with an address and not terminating: an engine whose /metrics can be read.

    Readiness is not required: an engine whose queue is full may report
    itself unready exactly when its load matters most.
    """
    status = pod.get("status") or {}
    return (
        status.get("phase") == "Running"
        and bool(status.get("podIP"))
        and not pod["metadata"].get("deletionTimestamp")
    )


def scrape_url(template: str, pod: Mapping, port: int) -> str:
    """The metrics URL of a pod (a dict of the API's Pod), from the operator's template;
    `port` is its runtime's."""
    return template.format(
        pod_ip=pod.get("status", {}).get("podIP", ""),
        pod_name=pod["metadata"]["name"],
        namespace=pod["metadata"]["namespace"],
        port=port,
    )


@dataclass(frozen=True, slots=True)
class ScrapeRound:
    """What one round read: each pod's sample, and why a pod's answer was ignored.

    ``ignored`` holds the pods whose /metrics answered but cannot be used (over the cap,
    not Prometheus text): a fault of the engine image, worth telling the service's owner.
    A pod that did not answer (starting, stopping) is in neither.
    """

    samples: dict[str, EngineSample]
    ignored: dict[str, str]


async def scrape(
    urls: Mapping[str, str], timeout_s: float, names: MetricNames = INFERGRID_METRICS
) -> ScrapeRound:
    """Every pod's sample, read concurrently under its runtime's series `names`; a pod that
    fails to answer is left out.

    timeout_s bounds each request, body included (aiohttp's total timeout is per request).
    """
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        bodies = await asyncio.gather(*(_fetch(session, p, u) for p, u in urls.items()))
    fetched = dict(zip(urls, bodies, strict=True))
    read = {pod: body for pod, body in fetched.items() if isinstance(body, bytes)}
    samples, unreadable = await asyncio.to_thread(parse_bodies, read, names)
    refused = {pod: body.reason for pod, body in fetched.items() if isinstance(body, _Refused)}
    return ScrapeRound(samples, refused | unreadable)


def parse_bodies(
    bodies: Mapping[str, bytes], names: MetricNames = INFERGRID_METRICS
) -> tuple[dict[str, EngineSample], dict[str, str]]:
    """Each pod's sample, and why each body that is not UTF-8 Prometheus text was left out."""
    samples, unreadable = {}, {}
    for pod, body in bodies.items():
        try:
            samples[pod] = parse_engine_metrics(body.decode(), names)
        except ValueError as err:  # UnicodeDecodeError is one
            log.warning("pod %s: unreadable metrics: %s", pod, err)
            unreadable[pod] = f"/metrics is not Prometheus text: {unreadable_reason(err)}"
    return samples, unreadable


@dataclass(frozen=True, slots=True)
class _Refused:
    """An answer whose body was not read, and why."""

    reason: str


async def _fetch(session: aiohttp.ClientSession, pod: str, url: str) -> bytes | _Refused | None:
    """The body, a body refused unread (over the cap), or None for no answer."""
    try:
        async with session.get(url, allow_redirects=False) as resp:  # a 3xx: no answer
            if resp.status != 200:
                return None
            body = await read_capped(resp.content, MAX_METRICS_BYTES)
    except (aiohttp.ClientError, TimeoutError) as err:
        log.debug("pod %s: scrape of %s failed: %s", pod, url, err)
        return None
    if body is None:
        log.warning("pod %s: %s; scrape counted as failed", pod, OVER_CAP)
        return _Refused(OVER_CAP)
    return body


def parse_gateway_pending(text: str, namespace: str, service: str) -> float:
    """Requests the gateway holds for one service: its METRIC_GATEWAY_PENDING series, summed
    (a series repeated, as several gateway replicas' are when gathered, counts each time);
    0 when there is none.

    Raises ValueError on text that is not the Prometheus exposition format, and on a value
    that is no count (negative, NaN or infinite).
    """
    wanted = {"namespace": namespace, "service": service}
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name != METRIC_GATEWAY_PENDING:
                continue
            if any(sample.labels.get(key) != value for key, value in wanted.items()):
                continue
            if not (math.isfinite(sample.value) and sample.value >= 0):
                raise ValueError(f"{sample.name} of {namespace}/{service} is {sample.value}")
            total += sample.value
    return total


class MetricsUnreadable(Exception):
    """A /metrics that gave nothing usable: no answer, an error status, over the cap, or not
    Prometheus text. The message says which."""


async def gateway_pending(url: str, namespace: str, service: str, timeout_s: float) -> float:
    """The requests the gateway at `url` holds for the service, read within an engine
    scrape's bounds (timeout_s for the request, body included; MAX_METRICS_BYTES; parsed in
    a worker thread). Raises MetricsUnreadable."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(url, allow_redirects=False) as resp,
        ):
            if resp.status != 200:
                raise MetricsUnreadable(f"HTTP status {resp.status}")
            body = await read_capped(resp.content, MAX_METRICS_BYTES)
    except (aiohttp.ClientError, TimeoutError) as err:
        raise MetricsUnreadable(f"no answer: {err!r}") from err
    if body is None:
        raise MetricsUnreadable(OVER_CAP)
    try:
        return await asyncio.to_thread(parse_gateway_pending, body.decode(), namespace, service)
    except ValueError as err:  # UnicodeDecodeError is one
        raise MetricsUnreadable(f"unusable: {unreadable_reason(err)}") from err


def unreadable_reason(err: ValueError) -> str:
    """Why a body is unusable, in words of our own: the parser's message quotes the body's
    lines, and the reason goes into events a tenant's engine must not write."""
    if isinstance(err, UnicodeDecodeError):
        return "not UTF-8"
    return f"the parser refused it ({type(err).__name__})"
