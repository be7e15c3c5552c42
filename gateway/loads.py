"""Each engine pod's work as the gateway sees it, and the pods it keeps away from for now.

A pod's work is the requests this gateway has in flight to it, counted live, plus the work
its engine holds for others (other gateway replicas, clients that call the pod directly):
what the engine last reported on /metrics (queue depth plus running sequences), less what
this gateway had in flight to it at that moment. Reading only the engine's figure would
count the gateway's own requests twice, and for up to a scrape interval after they ended:
every pod that was busy at the last scrape would look busy, and the next requests would all
herd onto the others. /metrics is read every `scrape_interval_s` at most, bounded in bytes
and time and parsed off the event loop, as the operator reads it.

A pod that failed a request (refused the connection, died mid-answer) gets no new request
for a cooldown, unless every candidate is cooling down.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence

import aiohttp

from gateway.catalog import Backend, Key
from infergrid.capped_read import read_capped
from infergrid.engine_metrics import MAX_METRICS_BYTES, parse_engine_metrics

log = logging.getLogger("infergrid.gateway.loads")


class Loads:
    def __init__(self, cooldown_s: float) -> None:
        self.cooldown_s = cooldown_s
        self.in_flight: defaultdict[Key, int] = defaultdict(int)
        self.foreign: dict[Key, float] = {}  # work the engine holds that is not ours
        self._failed_until: dict[Key, float] = {}

    def work(self, key: Key) -> float:
        return self.in_flight.get(key, 0) + self.foreign.get(key, 0.0)

    def started(self, key: Key) -> None:
        self.in_flight[key] += 1

    def ended(self, key: Key) -> None:
        left = self.in_flight.get(key, 0) - 1
        if left > 0:
            self.in_flight[key] = left
        else:
            self.in_flight.pop(key, None)

    def reported(self, key: Key, held: float, ours: int) -> None:
        """The engine holds `held` requests; `ours` of them were this gateway's then."""
        self.foreign[key] = max(0.0, held - ours)

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
        for table in (self.foreign, self._failed_until):
            for key in [k for k in table if k not in keep]:
                del table[key]


async def scrape(
    session: aiohttp.ClientSession, loads: Loads, backends: Sequence[Backend], timeout_s: float
) -> None:
    """Reads every pod's /metrics at once; a pod that does not answer in time keeps its
    last figure."""
    await asyncio.gather(*(_one(session, loads, b, timeout_s) for b in backends))


async def _one(
    session: aiohttp.ClientSession, loads: Loads, backend: Backend, timeout_s: float
) -> None:
    try:
        async with asyncio.timeout(timeout_s):
            async with session.get(f"{backend.url}/metrics", allow_redirects=False) as response:
                if response.status != 200:
                    return
                body = await read_capped(response.content, MAX_METRICS_BYTES)
                ours = loads.in_flight.get(backend.key, 0)  # as the engine wrote its figures
        if body is None:
            return
        text = body.decode("utf-8", "replace")
        sample = await asyncio.to_thread(parse_engine_metrics, text, backend.metrics)
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as err:
        log.debug("scrape of %s/%s failed: %s", backend.namespace, backend.pod, err)
        return
    if sample.requests_held is not None:
        loads.reported(backend.key, sample.requests_held, ours)
