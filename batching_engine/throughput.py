"""Recent load, measured over a sliding window: how fast work finishes and how busy we are.

Two consumers: Retry-After on a 429 (how long until the queue ahead of a client has
drained), and the utilisation gauge the operator's autoscaler reads. Both take the time as
an argument, so tests drive them with made-up clocks.
"""

from __future__ import annotations

import math
from collections import deque

MIN_RETRY_AFTER_S = 1
MAX_RETRY_AFTER_S = 60


def retry_after_s(queue_depth: int, completions_per_s: float) -> int:
    """Whole seconds until `queue_depth` requests should have finished, from 1 to 60.

    With no recent completions there is nothing to extrapolate from, so the client is told
    to come back after the shortest wait rather than the longest: a cold engine drains fast.
    """
    if completions_per_s <= 0:
        return MIN_RETRY_AFTER_S
    estimate = min(queue_depth / completions_per_s, MAX_RETRY_AFTER_S)  # may be inf
    return max(MIN_RETRY_AFTER_S, math.ceil(estimate))


class RateWindow:
    """Events per second over the last `window_s` seconds."""

    def __init__(self, window_s: float = 30.0) -> None:
        self.window_s = window_s
        self._events: deque[tuple[float, int]] = deque()

    def add(self, now: float, count: int = 1) -> None:
        self._events.append((now, count))
        self._forget(now)

    def rate(self, now: float) -> float:
        """Events in the window divided by the window, or by the time since the first event
        when that is shorter (but at least a second), so a fresh engine's rate is neither
        diluted by time it did not run nor blown up by one event a moment ago."""
        self._forget(now)
        if not self._events:
            return 0.0
        span = min(max(now - self._events[0][0], 1.0), self.window_s)
        return sum(count for _, count in self._events) / span

    def _forget(self, now: float) -> None:
        while self._events and self._events[0][0] < now - self.window_s:
            self._events.popleft()


class BusyWindow:
    """Percent of the last `window_s` seconds spent inside busy intervals."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._intervals: deque[tuple[float, float]] = deque()

    def add(self, start: float, end: float) -> None:
        self._intervals.append((start, end))
        self._forget(end)

    def percent(self, now: float) -> float:
        self._forget(now)
        begin = now - self.window_s
        busy = sum(max(0.0, min(end, now) - max(start, begin)) for start, end in self._intervals)
        return 100.0 * min(busy / self.window_s, 1.0)

    def _forget(self, now: float) -> None:
        while self._intervals and self._intervals[0][1] < now - self.window_s:
            self._intervals.popleft()
