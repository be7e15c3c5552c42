"""The autoscaler over metric series: up at once, down slowly and late, never flapping."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from inference_operator.autoscaler import (
    ScalingPolicy,
    desired_replicas,
    history_after,
    ratios,
    recommend,
)
from inference_operator.metrics_scrape import ServiceMetrics
from inference_operator.spec import Autoscaling

TICK = 15.0
POLICY = ScalingPolicy(min_replicas=1, max_replicas=20, tolerance=0.1, stabilization_s=300,
                scale_down_max_percent=20)  # fmt: skip


def run(loads: list[float], policy: ScalingPolicy = POLICY, start: int = 4) -> list[int]:
    """Replicas after each tick, for a total load given in replicas working at target.

    Every pod reports and the load spreads evenly, so each pod's ratio is load / replicas.
    """
    replicas, history, seen = start, (), []
    for tick, load in enumerate(loads):
        metric = {"queueDepth": load / replicas} if replicas else {}
        decision = desired_replicas(replicas, replicas, metric, policy, history, tick * TICK)
        replicas, history = decision.replicas, decision.history
        seen.append(replicas)
    return seen


def test_ratio_is_the_largest_over_the_metrics():
    metrics = ServiceMetrics(pods=2, queue_depth=16, p99_latency_ms=250, gpu_utilization=40)
    got = ratios(metrics, Autoscaling(target_queue_depth=8, target_p99_latency_ms=500,
                                      target_gpu_utilization=80))  # fmt: skip
    assert got == {"queueDepth": 2.0, "p99LatencyMs": 0.5, "gpuUtilization": 0.5}
    assert ratios(ServiceMetrics(pods=0), Autoscaling()) == {}


def test_scales_up_at_once():
    assert run([12.0]) == [12]


def test_scale_up_stops_at_max_and_down_at_min():
    assert run([50.0]) == [20]
    assert run([0.0] * 40, start=2)[-1] == 1


def test_a_load_within_tolerance_changes_nothing():
    assert run([4.3, 3.7, 4.0, 4.39]) == [4, 4, 4, 4]
    assert run([4.5]) == [5]


def test_scale_down_waits_for_the_stabilisation_window():
    seen = run([2.0] * 40, start=10)
    window_ticks = int(POLICY.stabilization_s / TICK)
    assert seen[:window_ticks] == [10] * window_ticks
    assert seen[window_ticks] < 10


def test_scale_down_removes_at_most_20_percent_a_step():
    seen = run([1.0] * 60, start=20)
    steps = [a - b for a, b in zip([20, *seen], seen, strict=False)]
    assert max(steps) == 4  # 20% of 20
    limits = [max(1, before * 20 // 100) for before in [20, *seen]]
    assert all(step <= limit for step, limit in zip(steps, limits, strict=False))
    assert seen[-1] == 1


def test_small_services_still_shrink_one_replica_a_step():
    assert run([1.0] * 25, ScalingPolicy(1, 10, stabilization_s=0), start=4)[:4] == [3, 2, 1, 1]


def test_a_spike_inside_the_window_restarts_the_wait():
    loads = [2.0] * 10 + [8.0] + [2.0] * 30
    seen = run(loads, start=8)
    spike = 10
    assert seen[spike] == 8
    assert seen[spike + 19] == 8  # 300 s after the spike it still holds
    assert seen[spike + 21] < 8


def test_warm_pool_keeps_spares_above_the_load_without_growing():
    policy = ScalingPolicy(1, 20, stabilization_s=0, warm_pool=2)
    seen = run([3.0] * 20, policy, start=1)
    assert seen[0] == 5 and set(seen) == {5}
    assert recommend(current=5, reporting=5, metric_ratios={"queueDepth": 0.6},
                     policy=policy) == 5  # fmt: skip


def test_warm_pool_alone_when_idle():
    policy = ScalingPolicy(0, 20, stabilization_s=0, warm_pool=1)
    assert run([0.0] * 10, policy, start=4)[-1] == 1


def test_no_metrics_keep_the_count():
    decision = desired_replicas(3, 0, {}, POLICY, (), 0.0)
    assert (decision.replicas, decision.reason) == (3, "no metrics")


def test_a_count_outside_the_bounds_is_brought_inside_at_once():
    assert desired_replicas(30, 30, {"queueDepth": 1.0}, POLICY, (), 0.0).replicas == 20
    assert desired_replicas(0, 0, {}, POLICY, (), 0.0).replicas == 1


def test_a_restarted_autoscaler_waits_a_window_before_scaling_down():
    decision = desired_replicas(10, 10, {"queueDepth": 0.1}, POLICY, (), now=1000.0)
    assert decision.replicas == 10
    assert decision.history[0] == (1000.0, 10)


def test_a_count_scaled_up_by_hand_holds_for_a_window():
    """kubectl scale to 2 on an idle service: the autoscaler recommends 1 all along, yet keeps
    the 2 for a whole window, then shrinks as it would after a restart."""
    idle = {"queueDepth": 0.0}
    decision = desired_replicas(1, 1, idle, POLICY, (), now=0.0)
    history, last_set = decision.history, decision.replicas
    window_ticks = int(POLICY.stabilization_s / TICK)
    replicas, seen = 2, []  # what kubectl scale set
    for tick in range(1, window_ticks + 3):
        history = history_after(history, last_set, replicas)
        decision = desired_replicas(replicas, replicas, idle, POLICY, history, tick * TICK)
        replicas, history, last_set = decision.replicas, decision.history, decision.replicas
        seen.append(replicas)
    assert seen[:window_ticks] == [2] * window_ticks
    assert seen[-1] == 1


def test_the_autoscalers_own_count_keeps_its_history():
    history = ((0.0, 4), (15.0, 3))
    assert history_after(history, 3, 3) == history
    assert history_after(history, None, 7) == history
    assert history_after(history, 3, 5) == ()


loads = st.lists(st.floats(min_value=0.0, max_value=40.0), min_size=1, max_size=80)


@settings(max_examples=200, deadline=None)
@given(loads, st.integers(min_value=1, max_value=20))
def test_never_flaps_and_never_drops_too_fast(series, start):
    """No scale-down within a window after a scale-up; each drop within the step limit."""
    seen = run(series, start=start)
    window = int(POLICY.stabilization_s / TICK)
    last_up = None
    for tick, (before, after) in enumerate(zip([start, *seen], seen, strict=False)):
        assert POLICY.min_replicas <= after <= POLICY.max_replicas
        if after > before:
            last_up = tick
        if after < before:
            assert before - after <= max(1, before * POLICY.scale_down_max_percent // 100)
            assert last_up is None or tick - last_up >= window


@settings(max_examples=100, deadline=None)
@given(
    st.integers(min_value=2, max_value=18),
    st.lists(st.floats(min_value=-0.09, max_value=0.09), min_size=1, max_size=60),
)
def test_noise_within_tolerance_changes_nothing(replicas, noise):
    series = [replicas * (1 + n) for n in noise]
    assert set(run(series, start=replicas)) == {replicas}
