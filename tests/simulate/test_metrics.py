"""Binning measurements into the paper's curves, and summaries across seeds, by hand."""

import pytest

from infergrid.simulate.metrics import Curves, Measurement, Spread, binned_mean, curves, spread_at


def test_values_are_averaged_per_rounded_arrived_percent():
    points = [(0.4, 1.0), (0.6, 3.0), (1.4, 5.0), (2.6, 7.0), (2.4, 9.0)]
    assert binned_mean(points, last=3) == {0: 1.0, 1: 4.0, 2: 9.0, 3: 7.0}


def test_a_bin_without_data_takes_its_neighbours_like_the_paper():
    assert binned_mean([(10.0, 2.0), (12.0, 4.0)], last=14) == {
        9: 2.0,
        10: 2.0,
        11: 3.0,  # 10 and 12
        12: 4.0,
        13: 4.0,
    }


def test_rounding_is_half_to_even_as_pandas():
    assert binned_mean([(0.5, 1.0), (1.5, 2.0)], last=2) == {0: 1.0, 1: 1.5, 2: 2.0}


def test_curves_give_unallocated_fragmentation_and_failed_pods():
    # A 2-GPU node, 600-milli pods: arrived 30, 60, 90, 120, 150%; the third fails on.
    measurements = [
        Measurement(30.0, 30.0, 400 / 1400 * 100, 0),
        Measurement(60.0, 60.0, 100.0, 0),
        Measurement(90.0, 60.0, 100.0, 1),
        Measurement(120.0, 60.0, 100.0, 2),
        Measurement(150.0, 60.0, 100.0, 3),
    ]
    run = curves(measurements)
    assert run.unallocated_pct[30] == pytest.approx(70.0)
    assert run.unallocated_pct[90] == pytest.approx(40.0)
    assert 100 not in run.unallocated_pct  # nothing within a point of 100%
    assert run.frag_rate_pct[30] == pytest.approx(28.571, abs=1e-3)
    assert run.failed_pods[89] == 0
    assert run.failed_pods[90] == 1
    assert run.failed_pods[130] == 2  # the pod at 150% arrived is past the last bin


def test_spreads_are_mean_median_and_sample_sd():
    assert Spread.of([1.0, 2.0, 6.0]) == Spread(3.0, 2.0, pytest.approx(2.6457513))
    assert Spread.of([4.0]) == Spread(4.0, 4.0, 0.0)


def test_a_spread_needs_every_run_to_have_the_bin():
    one = Curves({100: 4.0}, {100: 50.0}, {100: 3})
    two = Curves({100: 6.0}, {}, {100: 5})
    assert spread_at([one, two], "unallocated_pct", 100) == Spread(
        5.0, 5.0, pytest.approx(1.41421356)
    )
    assert spread_at([one, two], "frag_rate_pct", 100) is None
    assert spread_at([one, two], "failed_pods", 100).median == 4.0
