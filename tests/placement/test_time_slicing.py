"""Time slices: on a node whose device plugin time-slices its GPUs (``gpuReplicas``, published
as the inventory's ``timeSlices``), up to N ``nvidia.com/gpu`` pods share one GPU, each seeing
all of it; a GPU never holds time slices and shares at once, and N == 1 is exclusive as ever."""

from collections import Counter
from dataclasses import replace
from datetime import timedelta

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from infergrid.assignment_annotation import (
    AssignedGpu,
    ContainerAssignment,
    PodAssignment,
    decode_assignment,
    encode_assignment,
)
from infergrid.inventory import GpuInventory
from infergrid.placement import (
    NodeSet,
    NodeState,
    build_node_state,
    choose_gpu_set,
    fit,
    recheck,
    release,
    reservation_from_assignment,
    to_pod_assignment,
)
from infergrid.pod_request import PodGpuRequest

from .builders import (
    A100_MIB,
    BINPACK,
    FGD,
    L4_MIB,
    NODE,
    NOW,
    SPREAD,
    STALE_AFTER,
    gpu,
    held_share,
    held_whole,
    inventory,
    mig,
    node_of,
    pod,
    share,
    whole,
)
from .test_properties import POLICIES, inventories, operations, usages

SLICED = replace(inventory(gpu(0), gpu(1)), time_slices=2)
ONE = pod(whole(1))


def whole_on(*indices: int) -> ContainerAssignment:
    return ContainerAssignment(
        "engine", gpus=tuple(AssignedGpu(f"GPU-{i}", L4_MIB, 100) for i in indices)
    )


def place_all(inv: GpuInventory, pods: list[PodGpuRequest], policy=BINPACK, **node_args):
    """Each pod placed in turn on ``inv``'s node: the node afterwards, and every result."""
    state = node_of(inv, **node_args)
    results = []
    for request in pods:
        result = fit(request, state, policy)
        results.append(result)
        state = result.after if result.fits else state
    return state, results


def test_four_time_slices_fill_two_gpus_and_the_fifth_is_refused_counting_the_full_gpus():
    state, results = place_all(SLICED, [ONE] * 5)
    assert [r.fits for r in results] == [True, True, True, True, False]
    assert [g.holders for g in state.gpus] == [2, 2]
    assert results[4].reasons == (
        "container 'engine': 0 of 2 GPUs have a time slice free, needs 1:"
        " 2 with every time slice taken",
    )


def test_each_time_slice_is_assigned_the_whole_gpu_which_counts_once():
    state, results = place_all(SLICED, [ONE, ONE])
    assert [r.placements for r in results] == [(whole_on(0),), (whole_on(0),)]
    held = state.gpus[0]
    assert (held.holders, held.assigned_mib, held.assigned_cores, held.free_mib) == (
        2,
        L4_MIB,
        100,
        0,
    )
    assert release(state, results[1].placements).gpus[0].assigned_mib == L4_MIB
    emptied = release(release(state, results[1].placements), results[0].placements)
    assert emptied == node_of(SLICED)


def test_packing_policies_stack_time_slices_and_spread_gives_each_its_own_gpu():
    for policy, holders in ((BINPACK, [2, 0]), (FGD, [2, 0]), (SPREAD, [1, 1])):
        state, _ = place_all(SLICED, [ONE, ONE], policy)
        assert [g.holders for g in state.gpus] == holders, policy.name


def test_a_pod_asking_for_two_gpus_gets_a_time_slice_of_two_distinct_gpus():
    state, results = place_all(SLICED, [pod(whole(2)), pod(whole(2)), pod(whole(2))])
    assert [r.placements for r in results[:2]] == [(whole_on(0, 1),), (whole_on(0, 1),)]
    assert results[2].reasons == (
        "container 'engine': 0 of 2 GPUs have a time slice free, needs 2:"
        " 2 with every time slice taken",
    )


def test_a_gpu_with_a_share_takes_no_time_slice_and_a_time_sliced_one_takes_no_share():
    state, results = place_all(SLICED, [pod(share(4096)), ONE, ONE, ONE])
    assert [r.fits for r in results] == [True, True, True, False]
    assert [(g.shares, g.holders) for g in state.gpus] == [(1, 0), (0, 2)]
    assert results[3].reasons[0].endswith("1 with every time slice taken, 1 holding shares")
    spread, _ = place_all(SLICED, [ONE, ONE], SPREAD)
    refused = fit(pod(share(1024, 10)), spread, BINPACK)
    assert refused.reasons == tuple(
        f"container 'engine': GPU-{i} (index {i}): time-sliced: 1 of 2 time slices taken"
        for i in (0, 1)
    )


def test_measured_use_does_not_keep_a_time_slice_off_but_exclusive_gpus_still_need_idle():
    busy = {0: 20000, 1: 20000}
    _, (sliced,) = place_all(SLICED, [ONE], used=busy)
    _, (exclusive,) = place_all(replace(SLICED, time_slices=1), [ONE], used=busy)
    assert sliced.fits and not exclusive.fits


def test_unhealthy_gpus_stale_nodes_and_mig_gpus_offer_no_time_slice():
    sick = replace(SLICED, gpus=tuple(replace(g, healthy=False) for g in SLICED.gpus))
    assert fit(ONE, node_of(sick), BINPACK).reasons[0].endswith("needs 1: 2 unavailable")
    stale = node_of(SLICED, heartbeat=NOW - STALE_AFTER - timedelta(seconds=1))
    assert fit(ONE, stale, BINPACK).reasons[0].startswith("node heartbeat is stale")
    a100 = "NVIDIA A100-SXM4-80GB"
    in_mig = replace(inventory(gpu(0, A100_MIB, a100, mig=("3g.40gb",))), time_slices=4)
    assert fit(ONE, node_of(in_mig), BINPACK).reasons[0].endswith("needs 1: 1 in MIG mode")
    assert fit(pod(mig("3g.40gb")), node_of(in_mig), BINPACK).fits


def test_the_device_plugin_gate_takes_n_holders_and_refuses_the_next_naming_n():
    two = [held_whole(0, name="a"), held_whole(0, name="b")]
    assert recheck(node_of(SLICED, two[:1]), whole_on(0)) == ()
    (full,) = recheck(node_of(SLICED, two), whole_on(0))
    assert full.reason == "GPU-0 (index 0): time-sliced: 2 of 2 time slices taken"
    (shared,) = recheck(node_of(SLICED, [held_share(0, 1024, 10)]), whole_on(0))
    assert shared.reason == "GPU-0 (index 0): holds 1 share(s)"


def test_recorded_time_slices_beyond_n_are_reported_and_still_counted():
    node = node_of(SLICED, [held_whole(0, name=n) for n in "abc"])
    assert [i.reason for i in node.issues] == [
        "GPU-0 (index 0) is time-sliced: 2 of 2 time slices taken"
    ]
    assert node.gpus[0].holders == 3 and not node.gpus[0].takes_whole()


def test_the_node_set_answers_time_sliced_nodes_through_fit_beside_indexed_ones():
    sliced = node_of(SLICED, [held_whole(0, name="a"), held_whole(0, name="b")])
    plain = node_of(replace(inventory(gpu(0)), node="plain"))
    node_set = NodeSet()
    assert node_set.put(sliced, "sliced") == -1  # not indexed: placed by the policy's holders
    assert node_set.put(plain, "plain") >= 0
    for request in (ONE, pod(whole(2)), pod(share(4096))):
        for policy in POLICIES:
            verdicts = node_set.filter([NODE, "plain"], request, policy)
            results = [(s, fit(request, s, policy)) for s in (sliced, plain)]
            assert verdicts.passed == [s.name for s, r in results if r.fits]
            raw = node_set.scores([NODE, "plain"], request, policy)
            wanted = [
                policy.raw_score(s, r.after, policy.workload) if r.fits else np.nan
                for s, r in results
            ]
            assert np.array_equal(raw, np.array(wanted, dtype=float), equal_nan=True)


def check_time_slices(state: NodeState, live: dict[int, PodAssignment]) -> None:
    """Recounted from the live assignments: at most N holders, never with shares, memory once."""
    wholes, share_mib = Counter(), Counter()
    for assignment in live.values():
        for container in assignment.containers:
            for a in container.gpus:
                if container.shared:
                    share_mib[a.uuid] += a.memory_mib
                else:
                    wholes[a.uuid] += 1
    for g in state.gpus:
        assert g.holders == wholes[g.uuid] <= g.time_slices
        assert not (g.holders and g.shares)
        assert g.assigned_mib == share_mib[g.uuid] + (g.memory_mib if g.holders else 0)
        assert g.assigned_mib <= g.memory_mib


def check_whole_promises(before: NodeState, request: PodGpuRequest, result) -> None:
    """Each GPU a whole-GPU container got had a time slice left (or, at N == 1, was idle) and
    no share; at N == 1 the first such container got exactly ``choose_gpu_set``'s set."""
    gpus = {g.uuid: g for g in before.gpus}
    for container in result.placements:
        if container.kind != "whole":
            continue
        taken = [gpus[a.uuid] for a in container.gpus]
        assert len({g.uuid for g in taken}) == len(taken)
        assert all(g.available and not g.mig_enabled and g.shares == 0 for g in taken)
        assert all(g.idle for g in taken if not g.time_sliced)
    first = request.gpu_containers[0]
    if first.kind == "whole" and not any(g.time_sliced for g in before.gpus):
        free = [g for g in before.gpus if g.takes_whole()]
        nvlink = request.topology == "nvlink" and first.gpus > 1
        chosen = choose_gpu_set(free, first.gpus, nvlink)
        assert chosen is not None
        assert [a.uuid for a in result.placements[0].gpus] == [g.uuid for g in chosen]


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_random_fleets_and_pods_never_exceed_n_time_slices_nor_mix_them_with_shares(data):
    inv = replace(data.draw(inventories()), time_slices=data.draw(st.sampled_from((1, 2, 3, 4))))
    use = data.draw(usages(inv))
    base = build_node_state(inv, use, (), NOW, STALE_AFTER)
    state, live, serial = base, {}, 0
    for action, arg, policy in data.draw(operations):
        if action == "place":
            result = fit(arg, state, policy)
            if not result.fits:
                assert result.reasons and result.after is None
                continue
            check_whole_promises(state, arg, result)
            state, live[serial] = result.after, to_pod_assignment(NODE, result.placements, NOW)
            serial += 1
        elif live:
            key = sorted(live)[arg % len(live)]
            state = release(state, reservation_from_assignment(live.pop(key), state)[0])
        check_time_slices(state, live)
        annotations = [decode_assignment(encode_assignment(a)) for a in live.values()]
        rebuilt = build_node_state(inv, use, annotations, NOW, STALE_AFTER)
        assert rebuilt == state and rebuilt.issues == ()
        for assignment in live.values():
            for container in assignment.containers:
                assert recheck(release(state, (container,)), container) == ()
    for assignment in live.values():
        state = release(state, reservation_from_assignment(assignment, state)[0])
    assert state == base


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_time_slicing_changes_nothing_for_pods_that_ask_no_whole_gpu(data):
    """Shares and MIG instances go where they would without time slices. (fgd may choose
    otherwise, rightly: it weighs whole-GPU tasks, which a time slice lets use a GPU that
    measured use keeps from an exclusive one.)"""
    inv = data.draw(inventories())
    use = data.draw(usages(inv))
    exclusive = build_node_state(inv, use, (), NOW, STALE_AFTER)
    sliced = build_node_state(replace(inv, time_slices=4), use, (), NOW, STALE_AFTER)
    for action, request, _ in data.draw(operations):
        if action != "place" or any(c.kind == "whole" for c in request.gpu_containers):
            continue
        policy = data.draw(st.sampled_from((BINPACK, SPREAD)))
        one, many = fit(request, exclusive, policy), fit(request, sliced, policy)
        assert (one.placements, one.reasons) == (many.placements, many.reasons)
        if one.fits:
            exclusive, sliced = one.after, many.after
