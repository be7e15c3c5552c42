"""Pods that passed filter and whose bind has not reached the extender yet.

kube-scheduler binds asynchronously: once it has chosen a node for pod A it starts the next
pod's scheduling cycle while A's bind is still on its way. The extender learns where A went only
at bind, so B's filter and prioritize would see the cluster without A: a burst of binpack
replicas lands on several nodes, a burst of spread replicas piles onto one. So B's filter first
waits until every other pod that passed filter has been decided at bind (placed in the cache, or
refused), or until those pods' bounded wait has run out (kube-scheduler chose not to bind one,
or its bind is lost): then B goes ahead on what the cache holds, as it did before.

This wait costs about half of kube-scheduler's pods/s, as each filter follows the bind before
it; tentative reservations (`tentative`) place bursts as well without it, so it is off by
default (`bindWaitSeconds: 0`) and kept for clusters that turn those off.

`PendingBinds` is the bookkeeping, a plain object over a clock reading; `BindBarrier` puts it on
the event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class PendingBinds:
    """Each pod that passed filter, with the moment its wait for a bind runs out, and the pod
    as filter saw it (bind reserves its placement from that before reading the pod back)."""

    wait_s: float
    deadlines: dict[str, float] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)

    def passed_filter(self, uid: str, now: float, pod: dict[str, Any] | None = None) -> None:
        """The pod may be bound any moment; others wait for it until `now + wait_s`."""
        if self.wait_s > 0:
            self.deadlines[uid] = now + self.wait_s
            if pod is not None:
                self.pods[uid] = pod

    def filtered_pod(self, uid: str) -> dict[str, Any] | None:
        return self.pods.get(uid)

    def decided(self, uid: str) -> None:
        """Its bind reached the extender: its placement is in the cache, or it was refused."""
        self.deadlines.pop(uid, None)
        self.pods.pop(uid, None)

    def time_left(self, uid: str, now: float) -> float:
        """How long `uid`'s filter must still wait: until the last other pending pod is decided
        or runs out; 0 when none is pending. Pods past their deadline are dropped here."""
        expired = [other for other, deadline in self.deadlines.items() if deadline <= now]
        for other in expired:
            self.decided(other)
        others = [deadline for other, deadline in self.deadlines.items() if other != uid]
        return max(others, default=now) - now


class BindBarrier:
    """`PendingBinds` on the event loop: a filter awaits the others' binds, a bind wakes it."""

    def __init__(self, wait_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.pending = PendingBinds(wait_s)
        self.clock = clock
        self._waiters: set[asyncio.Future[None]] = set()

    async def wait_for_others(self, uid: str) -> tuple[float, bool]:
        """Wait until no other pod is pending, `wait_s` at most in all (kube-scheduler gives an
        extender call a timeout of its own). Returns the seconds waited and whether it ended
        because a pending pod ran out of time rather than being decided."""
        started = self.clock()
        ran_out = False
        while (left := self._left(uid, started)) > 0:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.add(waiter)
            try:
                await asyncio.wait_for(waiter, left)
            except TimeoutError:
                ran_out = True
            finally:
                self._waiters.discard(waiter)
        return self.clock() - started, ran_out

    def _left(self, uid: str, started: float) -> float:
        now = self.clock()
        return min(self.pending.time_left(uid, now), started + self.pending.wait_s - now)

    @property
    def waiting(self) -> int:
        """Filters waiting right now."""
        return len(self._waiters)

    def passed_filter(self, uid: str, pod: dict[str, Any] | None = None) -> None:
        self.pending.passed_filter(uid, self.clock(), pod)

    def decided(self, uid: str) -> None:
        """Called by bind, on every path; wakes every waiting filter to look again."""
        self.pending.decided(uid)
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
