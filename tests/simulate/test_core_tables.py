"""What the simulator added to the placement core: host resources in fit, and the
simulation-only policies in its tables, each scorer checked on a hand-computed case."""

import math
from dataclasses import replace

import pytest

from infergrid.constants import PLACEMENT_POLICIES
from infergrid.errors import ContractError
from infergrid.placement import (
    GPU_CHOICES,
    RAW_SCORERS,
    SIMULATION_GPU_CHOICES,
    SIMULATION_SCORERS,
    Demand,
    HostRequest,
    Workload,
    fit,
    model_contention,
    node_fragmentation,
    resolve_policy,
    with_cluster,
)
from infergrid.placement.fgd_cluster_aware import (
    cpu_asked_per_gpu,
    cpu_short,
    cpu_to_keep,
    fgd_cluster_aware_score,
    stranded_gpus,
)
from infergrid.simulate.cluster import node_state, pod_request
from infergrid.simulate.trace import TraceNode, TracePod

BEST_FIT = resolve_policy("best-fit")


def a_node(gpus: int = 2, cpu: int = 64000, model: str = "T4") -> object:
    return node_state(TraceNode("n", cpu, 262144, gpus, model))


def place(node, gpu_milli: int, num_gpu: int = 1, cpu: int = 8000, policy=BEST_FIT):
    """``node`` after one pod of that shape, placed by the core."""
    request, host = pod_request(TracePod("p", cpu, 1024, num_gpu, gpu_milli))
    after = fit(request, node, policy, host).after
    assert after is not None
    return after


def scored(name: str, before, gpu_milli: int, num_gpu: int = 1, cpu: int = 8000, workload=None):
    policy = resolve_policy(name, workload or Workload(((Demand(whole_gpus=1), 1.0),)))
    after = place(before, gpu_milli, num_gpu, cpu, policy)
    return policy.raw_score(before, after, policy.workload)


# --- host resources in fit -------------------------------------------------------------


def test_fit_reports_cpu_memory_and_model_shortfalls_with_their_numbers():
    node = a_node(gpus=1, cpu=4000)
    request, _ = pod_request(TracePod("p", 8000, 1024, 1, 1000))
    host = HostRequest(cpu_milli=8000, memory_mib=300000, gpu_models=frozenset({"V100M16"}))
    result = fit(request, node, BEST_FIT, host)
    assert not result.fits
    assert result.reasons == (
        "GPU model 'T4' is not one of V100M16",
        "4000 millicores of CPU free, needs 8000",
        "262144 MiB of memory free, needs 300000",
    )


def test_fit_reserves_cpu_and_memory_with_the_gpus():
    after = place(a_node(), 470, cpu=12000)
    assert (after.host.requested_cpu_milli, after.host.requested_memory_mib) == (12000, 1024)
    assert sum(g.shares for g in after.gpus) == 1


def test_a_cpu_only_pod_needs_cpu_but_no_model():
    request, host = pod_request(TracePod("p", 70000, 1024, 0, 0, frozenset({"A10"})))
    assert fit(request, a_node(cpu=64000), BEST_FIT, host).reasons == (
        "64000 millicores of CPU free, needs 70000",
    )
    assert fit(request, a_node(cpu=128000), BEST_FIT, host).fits


def test_without_a_host_request_fit_is_the_extenders():
    request, _ = pod_request(TracePod("p", 10**9, 10**9, 1, 500))
    assert fit(request, a_node(), BEST_FIT).fits


# --- the tables --------------------------------------------------------------------------


def test_the_extenders_policies_are_unchanged_and_simulation_ones_apart():
    assert set(RAW_SCORERS) == set(GPU_CHOICES) == set(PLACEMENT_POLICIES)
    assert set(SIMULATION_SCORERS) == set(SIMULATION_GPU_CHOICES)
    assert not set(SIMULATION_SCORERS) & set(RAW_SCORERS)


def test_an_unknown_policy_lists_every_name():
    with pytest.raises(
        ContractError, match="'tetris' is not one of binpack, spread, fgd, fgd-cluster-aware"
    ):
        resolve_policy("tetris")


# --- the paper's baselines, by hand --------------------------------------------------------


def test_best_fit_is_cpu_and_gpu_left_over_the_largest_node():
    # 64 cores, 2 GPUs; a 1-GPU pod of 8 cores leaves 56 cores and 1 GPU.
    left = 0.5 * 56000 / 128000 + 0.5 * 1000 / 8000
    assert scored("best-fit", a_node(), 1000) == pytest.approx(100 * (1 - left))


def test_dot_product_is_free_times_asked_over_the_largest_node():
    dot = (64000 / 128000) * (8000 / 128000) + (2000 / 8000) * (1000 / 8000)
    assert scored("dot-product", a_node(), 1000) == pytest.approx(100 * (1 - dot / 2))


def test_gpu_packing_prefers_shared_gpus_then_used_nodes_then_idle_ones():
    idle = a_node()
    assert scored("gpu-packing", idle, 1000) == 31  # 100 // 3 - 2 free GPUs
    shared = place(idle, 530)  # GPU 0 has 470 free
    assert scored("gpu-packing", shared, 300) == 96  # 100 - (470 * 100 // 1000) // 10
    assert scored("gpu-packing", shared, 1000) == 49  # 100 // 2 - 1 fresh GPU
    assert scored("gpu-packing", shared, 0, num_gpu=0) == 0


def test_gpu_clustering_prefers_nodes_of_the_pods_class_then_fuller_ones():
    idle = a_node(gpus=4)
    assert scored("gpu-clustering", idle, 300) == 25 * 4000 // 8000 + 25
    shares = place(idle, 530)
    assert scored("gpu-clustering", shares, 300) == 25 * 4530 // 8000 + 75
    both = place(shares, 1000)
    assert scored("gpu-clustering", both, 1000) == 25 * 5530 // 8000 + 50
    assert scored("gpu-clustering", place(idle, 1000), 300) == 25 * 5000 // 8000


def test_random_fit_scores_every_node_alike_and_picks_gpus_by_salt():
    assert scored("random-fit", a_node(), 300) == 0.0
    node = place(place(a_node(gpus=4), 100), 200)  # shares on GPUs 0 and 1
    policy = resolve_policy("random-fit")
    request, host = pod_request(TracePod("p", 1000, 1024, 1, 300))
    chosen = set()
    for salt in range(40):
        salted = type(policy)(policy.name, policy.choice, policy.raw_score, policy.workload, salt)
        result = fit(request, node, salted, host)
        chosen.add(result.placements[0].gpus[0].uuid)
        assert fit(request, node, salted, host).placements == result.placements
    assert len(chosen) == 4


def test_fgd_paper_is_the_sigmoid_of_fgds_decrease():
    workload = Workload(((Demand(whole_gpus=2), 1.0),))
    before = a_node()
    after = place(before, 1000)
    decrease = node_fragmentation(before, workload) - node_fragmentation(after, workload)
    assert decrease == pytest.approx(-1.0)  # the 2-GPU task no longer fits: 1 GPU of fragment
    expected = 100 / (1 + math.exp(1.0))
    assert scored("fgd-paper", before, 1000, workload=workload) == pytest.approx(expected)


# --- fgd-cluster-aware ---------------------------------------------------------------------------


def test_gpu_pods_cpu_per_gpu_weighs_tasks_by_popularity_and_gpus():
    workload = Workload(
        ((Demand(whole_gpus=2, cpu_milli=20000), 0.5), (Demand(cpu_milli=99000), 0.5))
    )
    assert cpu_asked_per_gpu(workload)[0] == 10000
    share = Workload(((Demand(memory_mib=8000, cores=50, cpu_milli=4000), 1.0),))
    assert cpu_asked_per_gpu(share)[0] == 8000


def test_stranded_gpus_are_those_free_cpu_cannot_feed():
    node = place(a_node(gpus=2, cpu=24000), 0, num_gpu=0, cpu=16000)  # 8 cores left
    assert stranded_gpus(node, per_gpu=8000) == pytest.approx(1.0)
    assert stranded_gpus(node, per_gpu=4000) == 0.0


def test_model_contention_is_demand_per_gpu_against_the_cluster():
    workload = Workload(
        (
            (Demand(whole_gpus=1), 0.5),
            (Demand(whole_gpus=1, gpu_models=frozenset({"T4"})), 0.5),
        )
    )
    # 0.5 spread over 10 GPUs (2 T4, 8 G2) and 0.5 on the 2 T4s: T4 gets 0.6, G2 0.4.
    contention = model_contention(workload, {"T4": 2, "G2": 8})
    assert contention == {"T4": pytest.approx(0.6 / 2 / 0.1 - 1), "G2": pytest.approx(-0.5)}
    assert model_contention(Workload(((Demand(whole_gpus=1), 1.0),)), {"T4": 2, "G2": 8}) == {
        "T4": 0.0,
        "G2": 0.0,
    }


def test_fgd_cluster_aware_keeps_pods_that_run_anywhere_off_contested_models():
    base = Workload(
        (
            (Demand(whole_gpus=1, cpu_milli=8000), 0.5),
            (Demand(whole_gpus=1, cpu_milli=8000, gpu_models=frozenset({"T4"})), 0.5),
        )
    )
    workload = with_cluster(base, {"T4": 2, "G2": 8})
    t4, g2 = a_node(model="T4"), a_node(model="G2")
    on_t4 = fgd_cluster_aware_score(t4, place(t4, 1000), workload)
    on_g2 = fgd_cluster_aware_score(g2, place(g2, 1000), workload)
    assert on_g2 > on_t4
    assert on_t4 == math.floor(-(0.6 / 2 / 0.1 - 1) / 0.04 + 1e-9)


def test_fgd_cluster_aware_prices_stranding_the_cpu_of_idle_gpus():
    workload = Workload(((Demand(whole_gpus=1, cpu_milli=8000), 1.0),))
    lean = a_node(gpus=2, cpu=20000)  # 20 cores for 2 GPUs of 8 cores each
    rich = a_node(gpus=2, cpu=64000)
    # A CPU-only pod of 12 cores strands one GPU on the lean node, none on the rich one.
    on_lean = fgd_cluster_aware_score(lean, place(lean, 0, num_gpu=0, cpu=12000), workload)
    on_rich = fgd_cluster_aware_score(rich, place(rich, 0, num_gpu=0, cpu=12000), workload)
    assert math.floor(on_lean) == -25  # one stranded GPU, in steps of 0.04
    assert math.floor(on_rich) == 0
    assert on_rich > 0  # ties among CPU-only placements go to the most spare CPU


GPU_POD, CPU_POD = Demand(whole_gpus=1, cpu_milli=8000), Demand(cpu_milli=4000)
"""Half the pods take a GPU and 8 cores, half 4 cores and no GPU: 12 cores asked per GPU."""


def test_cpu_is_short_where_the_workload_asks_more_per_gpu_than_the_cluster_has():
    workload = Workload(((GPU_POD, 0.5), (CPU_POD, 0.5)))
    assert cpu_asked_per_gpu(workload) == (8000, 4000)
    assert not cpu_short(workload)  # the cluster is not known
    assert cpu_to_keep(workload) == 8000
    roomy = replace(workload, cluster_cpu_per_gpu=12000)  # exactly enough: not short
    assert not cpu_short(roomy)
    assert cpu_to_keep(roomy) == 8000
    tight = with_cluster(workload, {"T4": 2, "G2": 8}, cpu_milli=100000)  # 10 cores per GPU
    assert tight.cluster_cpu_per_gpu == 10000
    assert cpu_short(tight)
    assert cpu_to_keep(tight) == 12000  # the CPU-only pods' 4 cores per GPU kept as well


def test_fgd_cluster_aware_keeps_cpu_for_cpu_only_pods_where_cpu_is_short():
    tight = Workload(((GPU_POD, 0.5), (CPU_POD, 0.5)), cluster_cpu_per_gpu=10000)
    node = a_node(gpus=2, cpu=24000)
    after = place(node, 0, num_gpu=0, cpu=4000)
    # c = 12 cores: the 20 left feed 5/3 of the 2 free GPUs, 1/3 stranded, 8.33 steps
    # down; the tie-break takes 0.01 per free GPU and has no spare CPU to add.
    assert fgd_cluster_aware_score(node, after, tight) == pytest.approx(-9 - 0.02)
    # Not short (c = 8 cores): nothing stranded, and 0.5 GPU of spare CPU.
    roomy = replace(tight, cluster_cpu_per_gpu=12000)
    assert fgd_cluster_aware_score(node, after, roomy) == pytest.approx(1e-5 * 0.5)


def test_fgd_cluster_aware_sends_cpu_only_pods_to_taken_gpus_where_cpu_is_short():
    tight = Workload(((GPU_POD, 0.5), (CPU_POD, 0.5)), cluster_cpu_per_gpu=10000)
    idle = a_node(gpus=2, cpu=96000)
    taken = place(a_node(gpus=2, cpu=64000), 1000, num_gpu=2, cpu=8000)  # 56 cores left
    on_idle = fgd_cluster_aware_score(idle, place(idle, 0, num_gpu=0, cpu=4000), tight)
    on_taken = fgd_cluster_aware_score(taken, place(taken, 0, num_gpu=0, cpu=4000), tight)
    # Both score step 0. Spare CPU at 12 cores per GPU: 92 cores feed 7.67 GPUs, 5.67
    # beyond the 2 free; 52 cores 4.33, all spare. Free GPUs come first: 2 cost 0.02.
    assert on_idle == pytest.approx(1e-7 * (92 / 12 - 2) - 0.02)
    assert on_taken == pytest.approx(1e-7 * (52 / 12))
    assert on_taken > on_idle
    # Where CPU is not short, the most spare CPU wins: 92 / 8 − 2 = 9.5 against 6.5.
    roomy = replace(tight, cluster_cpu_per_gpu=0.0)
    assert fgd_cluster_aware_score(
        idle, place(idle, 0, num_gpu=0, cpu=4000), roomy
    ) > fgd_cluster_aware_score(taken, place(taken, 0, num_gpu=0, cpu=4000), roomy)
