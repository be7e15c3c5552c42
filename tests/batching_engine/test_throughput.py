"""Recent load: Retry-After estimates, completion rates and busy time, on made-up clocks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from batching_engine.throughput import (
    MAX_RETRY_AFTER_S,
    MIN_RETRY_AFTER_S,
    BusyWindow,
    RateWindow,
    retry_after_s,
)


@pytest.mark.parametrize(
    ("depth", "rate", "seconds"),
    [(0, 5.0, 1), (10, 5.0, 2), (11, 5.0, 3), (100, 0.0, 1), (10_000, 1.0, 60), (3, 0.5, 6)],
)
def test_retry_after_is_the_queue_over_the_completion_rate(depth: int, rate: float, seconds: int):
    assert retry_after_s(depth, rate) == seconds


@given(st.integers(0, 10**6), st.floats(0, 1e4, allow_nan=False))
def test_retry_after_is_always_a_whole_second_from_1_to_60(depth: int, rate: float) -> None:
    assert MIN_RETRY_AFTER_S <= retry_after_s(depth, rate) <= MAX_RETRY_AFTER_S


def test_a_rate_counts_events_in_the_window_only() -> None:
    window = RateWindow(window_s=10)
    for t in range(20):
        window.add(float(t), 2)
    assert window.rate(20.0) == pytest.approx(2.0)  # events at 10..19, 20 in 10 s


def test_a_fresh_rate_divides_by_the_time_since_its_first_event_but_at_least_a_second() -> None:
    window = RateWindow(window_s=30)
    window.add(100.0, 4)
    assert window.rate(100.0) == pytest.approx(4.0)
    window.add(102.0, 4)
    assert window.rate(104.0) == pytest.approx(2.0)
    assert RateWindow().rate(5.0) == 0.0


def test_busy_time_is_the_share_of_the_window_inside_busy_intervals() -> None:
    busy = BusyWindow(window_s=10)
    busy.add(0.0, 4.0)  # partly before the window that ends at 12
    busy.add(5.0, 6.0)
    assert busy.percent(12.0) == pytest.approx(30.0)  # 2..4 and 5..6
    assert busy.percent(30.0) == 0.0


def test_busy_time_never_exceeds_100_percent() -> None:
    busy = BusyWindow(window_s=1)
    busy.add(0.0, 5.0)
    busy.add(0.0, 5.0)
    assert busy.percent(5.0) == 100.0
