"""The paper's protocol: per-seed shuffles, inflation to 130%, one attempt, no departure."""

import pytest

from infergrid.errors import ContractError
from infergrid.simulate.arrivals import arrivals
from infergrid.simulate.trace import TracePod


def pods(*gpu_milli: int) -> tuple[TracePod, ...]:
    return tuple(
        TracePod(f"p{i:02d}", 1000, 1024, 1 if m else 0, m) for i, m in enumerate(gpu_milli)
    )


TRACE = pods(1000, 500, 0, 1000, 250, 1000, 750, 0, 1000, 1000)  # 6.5 GPUs asked


def total(order, trace=TRACE) -> int:
    return sum(trace[i].gpu_request_milli for i in order.pods)


def test_a_seed_always_gives_the_same_node_order_and_arrivals():
    assert arrivals(20, TRACE, 8000, seed=42) == arrivals(20, TRACE, 8000, seed=42)


def test_other_seeds_shuffle_nodes_and_pods_differently():
    first, second = arrivals(20, TRACE, 8000, seed=42), arrivals(20, TRACE, 8000, seed=43)
    assert first.node_order != second.node_order
    assert first.pods[: len(TRACE)] != second.pods[: len(TRACE)]
    assert sorted(first.node_order) == list(range(20))


def test_every_trace_pod_arrives_once_then_draws_reach_130_percent():
    order = arrivals(4, TRACE, 8000, seed=7)
    assert sorted(order.pods[: len(TRACE)]) == list(range(len(TRACE)))
    target = 1.3 * 8000
    assert total(order) >= target
    last = TRACE[order.pods[-1]].gpu_request_milli
    assert total(order) - last < target  # stops at the first pod that reaches it


def test_inflation_is_a_parameter():
    assert total(arrivals(4, TRACE, 4000, seed=7, inflation=2.0)) >= 8000
    with pytest.raises(ContractError, match="inflation: must be above 0"):
        arrivals(4, TRACE, 4000, seed=7, inflation=0)


def test_a_trace_above_the_target_loses_pods_at_random():
    order = arrivals(4, TRACE, 4000, seed=7)  # 6.5 GPUs asked of a 1.3 × 4 = 5.2 target
    assert total(order) <= 1.3 * 4000
    assert len(set(order.pods)) == len(order.pods) < len(TRACE)


def test_a_trace_without_gpu_pods_cannot_be_inflated():
    with pytest.raises(ContractError, match="no pod asks for a GPU"):
        arrivals(4, pods(0, 0), 4000, seed=1)
