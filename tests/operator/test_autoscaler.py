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


SCALE_TO_ZERO = ScalingPolicy(min_replicas=0, max_replicas=5, stabilization_s=300,
                              target_queue_depth=8)  # fmt: skip
WINDOW_TICKS = int(SCALE_TO_ZERO.stabilization_s / TICK)


def test_an_idle_service_goes_to_zero_after_a_window_and_stays_there():
    """Engines that report no load: 1 replica for a window, then 0; with no pod left, nothing
    reports, and 0 stands."""
    seen = run([0.0] * (WINDOW_TICKS + 5), SCALE_TO_ZERO, start=1)
    assert seen[:WINDOW_TICKS] == [1] * WINDOW_TICKS
    assert seen[WINDOW_TICKS:] == [0] * 5


def test_one_pending_request_at_zero_replicas_asks_for_one():
    assert recommend(0, 0, {}, SCALE_TO_ZERO, pending=1) == 1
    decision = desired_replicas(0, 0, {}, SCALE_TO_ZERO, (), 0.0, pending=1)
    assert (decision.replicas, decision.reason) == (1, "1 requests pending at the gateway")


def test_no_pending_request_at_zero_replicas_stays_at_zero():
    assert recommend(0, 0, {}, SCALE_TO_ZERO, pending=0) == 0
    assert desired_replicas(0, 0, {}, SCALE_TO_ZERO, (), 0.0).replicas == 0


def test_pending_requests_ask_for_a_replica_per_target_queue_depth():
    assert recommend(0, 0, {}, SCALE_TO_ZERO, pending=8) == 1
    assert recommend(0, 0, {}, SCALE_TO_ZERO, pending=17) == 3
    assert recommend(2, 0, {}, SCALE_TO_ZERO, pending=1) == 2  # pods starting: the count stands


def test_pending_requests_add_to_the_load_as_queued_requests_would():
    """Two pods at target queue depth and two replicas' worth held at the gateway ask for
    what two pods at twice the target would."""
    busy = {"queueDepth": 1.0, "gpuUtilization": 0.5}
    assert recommend(2, 2, busy, SCALE_TO_ZERO, pending=16) == 4
    assert recommend(2, 2, {**busy, "queueDepth": 2.0}, SCALE_TO_ZERO) == 4
    assert recommend(2, 2, {"gpuUtilization": 0.5}, SCALE_TO_ZERO, pending=24) == 3
    hot = {"queueDepth": 0.5, "p99LatencyMs": 2.0}  # latency, not the queue, asks for most
    assert recommend(2, 2, hot, SCALE_TO_ZERO, pending=8) == 4


def test_pending_requests_are_clamped_by_max_replicas():
    assert recommend(0, 0, {}, SCALE_TO_ZERO, pending=1000) == SCALE_TO_ZERO.max_replicas
    assert recommend(3, 3, {"queueDepth": 1.0}, SCALE_TO_ZERO, pending=1000) == 5


def test_the_first_request_brings_an_idle_service_back_and_holds_it_a_window():
    """At 0 replicas a request waits at the gateway: 1 replica at once. Once it is served,
    the window remembers the 1, which holds before the service idles back to 0."""
    replicas, history = 0, ()
    for tick, pending in enumerate([0, 0, 1, 1]):  # the pod starts: the request still waits
        decision = desired_replicas(replicas, 0, {}, SCALE_TO_ZERO, history, tick * TICK,
                                    pending=pending)  # fmt: skip
        replicas, history = decision.replicas, decision.history
        assert replicas == (1 if pending else 0)
    seen = {}
    for tick in range(4, 4 + WINDOW_TICKS + 2):  # served; the engine reports no load
        decision = desired_replicas(replicas, replicas, {"queueDepth": 0.0} if replicas else {},
                                    SCALE_TO_ZERO, history, tick * TICK)  # fmt: skip
        replicas, history = decision.replicas, decision.history
        seen[tick] = replicas
    last_pending = 3
    assert {seen[t] for t in range(4, last_pending + WINDOW_TICKS)} == {1}
    assert seen[last_pending + WINDOW_TICKS] == 0


def test_a_count_the_gateway_set_from_zero_holds_for_a_window():
    """The gateway scales 0 -> 1 through the scale subresource, and its request is served
    before the autoscaler's next tick: the 1 is a count the autoscaler did not set, so it
    starts a new window (history_after), and holds for it before going back to 0."""
    decision = desired_replicas(0, 0, {}, SCALE_TO_ZERO, (), now=0.0)
    history, last_set = decision.history, decision.replicas
    replicas, seen = 1, []  # what the gateway set
    for tick in range(1, WINDOW_TICKS + 3):
        history = history_after(history, last_set, replicas)
        metric = {"queueDepth": 0.0} if replicas else {}
        decision = desired_replicas(replicas, replicas, metric, SCALE_TO_ZERO, history,
                                    tick * TICK)  # fmt: skip
        replicas, history, last_set = decision.replicas, decision.history, decision.replicas
        seen.append(replicas)
    assert seen[:WINDOW_TICKS] == [1] * WINDOW_TICKS
    assert seen[-1] == 0


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
