"""The FGD paper's fragmentation measure, on nodes small enough to compute by hand.

GPUs here have 10000 MiB, so a free fraction reads straight off the numbers.
"""

import pytest

from infergrid.errors import ContractError
from infergrid.placement import (
    DEFAULT_WORKLOAD,
    Demand,
    FragmentationTally,
    NodeState,
    Workload,
    free_capacity,
    node_fragmentation,
    task_fragmentation,
)
from infergrid.placement.learned import pod_demands
from infergrid.placement.reserve import reserved_share
from infergrid.placement.scoring import fgd_score

from .builders import A100_MIB, NOW, gpu, held_share, inventory, mig, node_of, pod, share, whole

TWO = inventory(gpu(0, memory=10000), gpu(1, memory=10000))
WHOLE_1 = Demand(whole_gpus=1)
WHOLE_2 = Demand(whole_gpus=2)


def test_an_empty_node_has_no_fragment_for_tasks_that_fit():
    node = node_of(TWO)
    assert task_fragmentation(node, WHOLE_1) == 0
    assert task_fragmentation(node, WHOLE_2) == 0
    assert task_fragmentation(node, Demand(whole_gpus=3)) == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("demand", "fragment"),
    [
        (WHOLE_1, 0.7),  # fits on GPU-0; GPU-1's 0.7 is a sliver to it
        (WHOLE_2, 1.7),  # cannot run at all: all free capacity is fragment
        (Demand(memory_mib=5000, cores=50), 0.0),  # both leftovers are usable
        (Demand(memory_mib=8000, cores=50), 0.7),  # GPU-1 has 7000 MiB: too little
    ],
)
def test_fragmentation_of_a_node_with_one_share(demand, fragment):
    node = node_of(TWO, [held_share(1, 3000, 30)])
    assert free_capacity(node.gpus[1]) == pytest.approx(0.7)
    assert task_fragmentation(node, demand) == pytest.approx(fragment)


def test_memory_and_sms_are_both_needed_to_use_a_leftover():
    node = node_of(TWO, [held_share(1, 1000, 90)])  # 90% memory free, 10% SMs
    assert free_capacity(node.gpus[1]) == pytest.approx(0.5)
    assert task_fragmentation(node, Demand(memory_mib=5000, cores=50)) == pytest.approx(0.5)
    assert task_fragmentation(node, Demand(memory_mib=5000, cores=10)) == 0


def test_node_fragmentation_weighs_tasks_by_popularity():
    node = node_of(TWO, [held_share(1, 3000, 30)])
    workload = Workload(((WHOLE_1, 0.5), (WHOLE_2, 0.5)))
    assert node_fragmentation(node, workload) == pytest.approx(0.5 * 0.7 + 0.5 * 1.7)


def test_a_stale_node_and_mig_gpus_have_no_free_capacity():
    assert node_fragmentation(node_of(TWO, heartbeat=NOW.replace(year=2024)), DEFAULT_WORKLOAD) == 0
    node = node_of(inventory(gpu(0, A100_MIB, "NVIDIA A100-SXM4-80GB", mig=("3g.40gb",))))
    assert free_capacity(node.gpus[0]) == 0


def test_fgd_scores_filling_a_sliver_above_breaking_an_idle_gpu():
    before = node_of(TWO, [held_share(1, 3000, 30)])  # F = 0.7 for one whole GPU
    on_idle = node_of(TWO, [held_share(1, 3000, 30), held_share(0, 3000, 30)])  # F = 1.4
    on_sliver = node_of(TWO, [held_share(1, 3000, 30), held_share(1, 3000, 30)])  # F = 0.4
    assert fgd_score(before, on_idle, DEFAULT_WORKLOAD) == pytest.approx(-0.7)
    assert fgd_score(before, on_sliver, DEFAULT_WORKLOAD) == pytest.approx(0.3)


def test_the_tally_predicts_one_gpu_change_exactly():
    node = node_of(inventory(*(gpu(i, memory=10000) for i in range(4))), [held_share(1, 3000, 30)])
    workload = Workload.of([(WHOLE_1, 2), (WHOLE_2, 1), (Demand(memory_mib=6000, cores=40), 1)])
    tally = FragmentationTally(node, workload)
    assert tally.total() == pytest.approx(node_fragmentation(node, workload))
    for at, old in enumerate(node.gpus):
        new = reserved_share(old, 4000, 40)
        changed = node.gpus[:at] + (new,) + node.gpus[at + 1 :]
        expected = node_fragmentation(NodeState(node.name, changed, True), workload)
        assert tally.total_if(old, new) == pytest.approx(expected)


def typical(pods, **limits) -> Workload:
    """The typical task types of the pods' GPU containers, as the learned workload reads them."""
    return Workload.from_demands((d for p in pods for d in pod_demands(p)), **limits)


def test_a_workload_from_requests_counts_gpu_containers():
    pods = [pod(share(8192, 30))] * 3 + [pod(whole(2), mig("3g.40gb", name="m"))]
    workload = typical(pods)
    assert workload.tasks == ((Demand(memory_mib=8192, cores=30), 0.75), (WHOLE_2, 0.25))


def test_no_requests_give_the_default_workload():
    assert typical([]) is DEFAULT_WORKLOAD
    assert typical([pod(mig("1g.10gb"))]) is DEFAULT_WORKLOAD
    assert DEFAULT_WORKLOAD.tasks == ((WHOLE_1, 1.0),)


def test_typical_types_cover_95_percent_then_stop():
    pods = [pod(whole(1))] * 90 + [pod(whole(2))] * 6 + [pod(whole(4))] * 4
    workload = typical(pods)
    assert workload.tasks == ((WHOLE_1, 90 / 96), (WHOLE_2, 6 / 96))
    assert typical(pods, max_types=1).tasks == ((WHOLE_1, 1.0),)


def test_equal_counts_rank_the_smaller_demand_first():
    pods = [pod(whole(2)), pod(whole(1))]
    assert typical(pods, coverage=0.5).tasks == ((WHOLE_1, 1.0),)


@pytest.mark.parametrize(
    "make",
    [
        lambda: Demand(),
        lambda: Demand(whole_gpus=1, memory_mib=10),
        lambda: Demand(cores=10),
        lambda: Demand(memory_mib=10, cores=101),
        lambda: Demand(whole_gpus=-1),
        lambda: Workload(()),
        lambda: Workload(((WHOLE_1, 0.5),)),
        lambda: Workload(((WHOLE_1, float("nan")),)),
        lambda: Workload.of([(WHOLE_1, 0.0)]),
    ],
    ids=[
        "no demand",
        "whole and share",
        "share without memory",
        "cores above 100",
        "negative",
        "empty workload",
        "popularity not summing to 1",
        "NaN popularity",
        "zero weights",
    ],
)
def test_bad_demands_and_workloads_are_refused(make):
    with pytest.raises(ContractError):
        make()
