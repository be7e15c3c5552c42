"""Replays on clusters small enough to follow by hand, through the real placement core."""

import random

import pytest

from infergrid.simulate.arrivals import Arrivals, arrivals
from infergrid.simulate.policies import SIM_POLICIES, sim_policy
from infergrid.simulate.replay import Scenario, play, replay
from infergrid.simulate.trace import TraceNode, TracePod

BEST_FIT = sim_policy("best-fit")


def pod(name: str, gpu_milli: int, num_gpu: int = 1, cpu: int = 1000, spec=()) -> TracePod:
    return TracePod(name, cpu, 1024, num_gpu if gpu_milli else 0, gpu_milli, frozenset(spec))


def node(name: str, gpus: int, model: str = "T4", cpu: int = 64000) -> TraceNode:
    return TraceNode(name, cpu, 262144, gpus, model)


def test_shares_fill_until_no_gpu_has_room_and_every_metric_follows():
    # One node of 2 GPUs; 600-milli pods arrive until 130% of 2 GPUs: 5 of them.
    scenario = Scenario.of([node("n0", 2)], [pod("p", 600)])
    run = replay(scenario, BEST_FIT, seed=1)
    assert (run.pods, run.failed_pods) == (5, 3)
    # After pod 1 (30% arrived): GPU 0 holds 600, 1400 milli idle; for the one typical
    # pod (600) GPU 1 still fits, so only GPU 0's 400 is fragment: 400/1400.
    assert run.curves.unallocated_pct[30] == pytest.approx(70.0)
    assert run.curves.frag_rate_pct[30] == pytest.approx(100 * 400 / 1400)
    # Pod 2 takes GPU 1; pods 3 to 5 find 400 milli per GPU and fail.
    assert run.curves.unallocated_pct[60] == pytest.approx(40.0)
    assert run.curves.unallocated_pct[90] == pytest.approx(40.0)
    assert run.curves.frag_rate_pct[90] == pytest.approx(100.0)
    assert run.curves.failed_pods[90] == 1
    assert run.curves.failed_pods[130] == 2  # the third failure is at 150% arrived


def test_each_pod_gets_one_attempt_and_nothing_departs():
    nodes = [node("a", 2), node("b", 1, "P100")]
    pods = [pod("w", 1000), pod("s", 300), pod("c", 0, cpu=30000)]
    scenario = Scenario.of(nodes, pods)
    order = arrivals(len(nodes), pods, scenario.capacity_milli, seed=5)
    played = play(scenario, BEST_FIT, order)
    assert len(played.measurements) == len(played.placed_on) == len(order.pods)
    allocated = [m.allocated_pct for m in played.measurements]
    assert allocated == sorted(allocated)  # never falls: nothing is released
    failed = [m.failed for m in played.measurements]
    assert failed[-1] == played.placed_on.count(None)
    assert all(b - a in (0, 1) for a, b in zip(failed, failed[1:], strict=False))


def test_cpu_and_memory_are_filtered_like_kube_scheduler():
    # The node has a free GPU but only 4 cores; the pod needs 8.
    scenario = Scenario.of([node("n0", 1, cpu=4000)], [pod("p", 1000, cpu=8000)])
    run = replay(scenario, BEST_FIT, seed=3)
    assert run.failed_pods == run.pods == 2
    assert run.curves.unallocated_pct[100] == pytest.approx(100.0)
    # The one typical pod cannot run there for lack of CPU: every idle GPU is fragment.
    assert run.curves.frag_rate_pct[100] == pytest.approx(100.0)


def test_gpu_spec_restricts_the_models():
    nodes = [node("t4", 1, "T4"), node("g2", 1, "G2")]
    scenario = Scenario.of(nodes, [pod("p", 1000, spec=("T4",))])
    order = arrivals(2, scenario.pods, scenario.capacity_milli, seed=9)
    played = play(scenario, BEST_FIT, order)
    assert played.placed_on == ("t4", None, None)


def test_fragmentation_counts_all_idle_gpu_for_cpu_only_and_disallowed_models():
    # Typical pods: a whole T4 GPU and a CPU-only pod, half each. On the T4 node
    # the GPU pod fits (no sliver) and the CPU-only pod sees its 1000 idle milli
    # as fragment: F = 500. On the G2 node neither can use the GPU: F = 1000.
    nodes = [node("t4", 1, "T4"), node("g2", 1, "G2")]
    pods = [pod("w", 1000, spec=("T4",)), pod("c", 0)]
    scenario = Scenario.of(nodes, pods)
    # By hand: the CPU-only pod, then the T4 pod twice (the second finds no T4).
    played = play(scenario, BEST_FIT, Arrivals(0, (0, 1), (1, 0, 0)))
    assert played.placed_on[1:] == ("t4", None)
    first, second, third = played.measurements
    assert (first.arrived_pct, first.allocated_pct) == (0.0, 0.0)
    assert first.frag_rate_pct == pytest.approx(100 * (500 + 1000) / 2000)
    # The T4 is taken: 1000 milli idle, all of it on the G2, all fragment.
    assert (second.arrived_pct, second.allocated_pct, second.frag_rate_pct) == (50.0, 50.0, 100.0)
    assert (third.arrived_pct, third.allocated_pct, third.failed) == (100.0, 50.0, 1)


def random_trace(seed: int) -> tuple[list[TraceNode], list[TracePod]]:
    rng = random.Random(seed)
    shapes = [(8, "G2", 96000), (2, "T4", 104000), (4, "V100M16", 32000), (1, "P100", 8000)]
    nodes = [node(f"n{i}", *rng.choice(shapes)) for i in range(6)]
    sizes = [0, 1000, 1000, 810, 470, 320, 160, 2000, 4000]
    pods = []
    for i in range(25):
        size = rng.choice(sizes)
        count, milli = (size // 1000, 1000) if size > 1000 else (1, size)
        spec = rng.choice([(), (), ("T4",), ("V100M16", "G2")])
        pods.append(pod(f"p{i}", milli, count, cpu=rng.choice([2000, 8000, 16000]), spec=spec))
    return nodes, pods


@pytest.mark.parametrize("name", list(SIM_POLICIES))
def test_grouping_nodes_by_signature_places_as_asking_every_node(name):
    nodes, pods = random_trace(11)
    scenario = Scenario.of(nodes, pods)
    order = arrivals(len(nodes), pods, scenario.capacity_milli, seed=2)
    cached = play(scenario, SIM_POLICIES[name], order, cache=True)
    every = play(scenario, SIM_POLICIES[name], order, cache=False)
    assert cached.placed_on == every.placed_on
    assert cached.measurements == every.measurements
    assert cached.evaluations < every.evaluations


def test_a_replay_is_deterministic_per_seed():
    nodes, pods = random_trace(4)
    scenario = Scenario.of(nodes, pods)
    random_fit = sim_policy("random-fit")
    assert replay(scenario, random_fit, 8).curves == replay(scenario, random_fit, 8).curves


def test_production_policies_learn_their_workload_unless_fed_the_trace():
    """fgd and fgd-cluster-aware learn as the extender does; the paper's policies (and
    binpack and spread, which read no workload) never learn."""
    nodes = [node("a", 2), node("b", 2)]
    pods = [pod("s", 300), pod("w", 1000)]
    learned, fed = Scenario.of(nodes, pods), Scenario.of(nodes, pods, learned=False)
    for name in ("fgd", "fgd-cluster-aware"):
        assert replay(learned, SIM_POLICIES[name], 1).learned
        assert not replay(fed, SIM_POLICIES[name], 1).learned
    for name in ("binpack", "best-fit", "fgd-paper"):
        assert not replay(learned, SIM_POLICIES[name], 1).learned
