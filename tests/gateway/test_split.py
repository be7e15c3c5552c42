"""The canary split is an exact share of requests, spread out, whatever the pod counts."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.split import TrackSplit
from infergrid.tracks import CANARY, STABLE


@given(st.integers(min_value=1, max_value=99), st.integers(min_value=1, max_value=500))
def test_every_run_of_picks_is_within_one_request_of_the_weights(percent, picks):
    split = TrackSplit()
    weights = {STABLE: 100 - percent, CANARY: percent}
    chosen = [split.pick(weights) for _ in range(picks)]
    canary = chosen.count(CANARY)
    assert abs(canary - picks * percent / 100) <= 1


def test_ninety_ten_gives_exactly_one_hundred_canary_requests_in_a_thousand_spread_out():
    split = TrackSplit()
    chosen = [split.pick({STABLE: 90, CANARY: 10}) for _ in range(1000)]
    assert chosen.count(CANARY) == 100
    assert (
        max(len(run) for run in "".join("c" if t == CANARY else "s" for t in chosen).split("s"))
        == 1
    )


def test_a_track_that_leaves_keeps_no_credit_for_a_burst_when_it_returns():
    split = TrackSplit()
    for _ in range(50):
        split.pick({STABLE: 90})
    back = [split.pick({STABLE: 90, CANARY: 10}) for _ in range(10)]
    assert back.count(CANARY) == 1


def test_picking_without_tracks_is_refused():
    try:
        TrackSplit().pick({})
    except ValueError as err:
        assert "no track" in str(err)
    else:
        raise AssertionError("picked from nothing")
