"""Answers to missing or invalid API keys, rate-limited per client address.

Each address has a bucket of failures (`FAILURES_BURST`, refilled at `FAILURES_PER_S`); a
request whose key fails with the bucket empty gets a 429 with Retry-After instead of a 401,
and the gateway logs and counts no more of them. The limit applies to failing keys only: a
valid key is never refused by it, so clients that share an address with a flood (behind one
load balancer) are not locked out. Guessing is not what it stops (a key has 16 characters
at least); floods of 401s are. Pure over a clock the caller passes in, and bounded in memory.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

from gateway.admission import TokenBucket

FAILURES_PER_S: Final = 1.0
FAILURES_BURST: Final = 10.0
MAX_ADDRESSES: Final = 100_000


class FailedKeys:
    """Failure buckets by address, the least recently failing forgotten past `max_addresses`
    (a forgotten address starts with a full bucket: at worst a burst more of 401s)."""

    def __init__(self, max_addresses: int = MAX_ADDRESSES) -> None:
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()
        self._max = max_addresses

    def failed(self, address: str, now: float) -> float:
        """Counts one failure from `address`: 0 when it may still have its 401, else the
        seconds until it may fail again (answer 429 with them)."""
        bucket = self._buckets.pop(address, None) or TokenBucket(FAILURES_PER_S, FAILURES_BURST)
        self._buckets[address] = bucket
        while len(self._buckets) > self._max:
            self._buckets.popitem(last=False)
        wait = bucket.wait_for(1.0, now)
        if wait == 0:
            bucket.charge(1.0, now)
        return wait
