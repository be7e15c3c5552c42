"""Each engine pod's work as the gateway sees it, and the pods it keeps away from for now.

Work is the requests the gateway has in flight to a pod plus the queue depth the pod's
engine last reported on /metrics, read every `scrape_interval_s` at most (bounded in bytes
and time, parsed off the event loop, as the operator reads them). A pod that failed a
request (refused the connection, died mid-answer) gets no new request for a cooldown, unless
every candidate is cooling down.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence

import aiohttp
from infergrid.engine_metrics import MAX_METRICS_BYTES, parse_engine_metrics

from gateway.catalog import Backend, Key

log = logging.getLogger("infergrid.gateway.loads")


class Loads:
    def __init__(self, cooldown_s: float) -> None:
        self.cooldown_s = cooldown_s
        self.in_flight: defaultdict[Key, int] = defaultdict(int)
        self.queue_depth: dict[Key, float] = {}
        self._failed_until: dict[Key, float] = {}

    def work(self, key: Key) -> float:
        return self.in_flight.get(key, 0) + self.queue_depth.get(key, 0.0)

    def started(self, key: Key) -> None:
        self.in_flight[key] += 1

    def ended(self, key: Key) -> None:
        left = self.in_flight.get(key, 0) - 1
        if left > 0:
            self.in_flight[key] = left
        else:
            self.in_flight.pop(key, None)

    def failed(self, key: Key, now: float) -> None:
        self._failed_until[key] = now + self.cooldown_s

    def usable(self, backends: Sequence[Backend], now: float) -> list[Backend]:
        """The backends not cooling down; all of them when every one is."""
        fine = [b for b in backends if self._failed_until.get(b.key, 0.0) <= now]
        return fine or list(backends)

    def keep_only(self, live: Iterable[Key]) -> None:
        """Forgets the figures of pods that left the catalog (in-flight counts stay: their
        requests still end and decrement them)."""
        keep = set(live)
        for table in (self.queue_depth, self._failed_until):
            for key in [k for k in table if k not in keep]:
                del table[key]


async def scrape_queue_depths(
    session: aiohttp.ClientSession, backends: Sequence[Backend], timeout_s: float
) -> dict[Key, float]:
    """Each pod's reported queue depth; a pod that does not answer in time keeps none."""
    results = await asyncio.gather(*(_one(session, b, timeout_s) for b in backends))
    return {b.key: depth for b, depth in zip(backends, results, strict=True) if depth is not None}


async def _one(session: aiohttp.ClientSession, backend: Backend, timeout_s: float) -> float | None:
    try:
        async with asyncio.timeout(timeout_s):
            async with session.get(f"{backend.url}/metrics") as response:
                if response.status != 200:
                    return None
                body = await response.content.read(MAX_METRICS_BYTES + 1)
        if len(body) > MAX_METRICS_BYTES:
            return None
        sample = await asyncio.to_thread(parse_engine_metrics, body.decode("utf-8", "replace"))
        return sample.queue_depth
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as err:
        log.debug("scrape of %s/%s failed: %s", backend.namespace, backend.pod, err)
        return None
