"""Node state from annotations, and reserving and releasing on it."""

import re
from datetime import datetime, timedelta

import pytest

from infergrid.assignment_annotation import (
    AssignedGpu,
    AssignedMig,
    ContainerAssignment,
    PodAssignment,
)
from infergrid.errors import ContractError
from infergrid.placement import (
    IDLE_USED_MIB,
    apply,
    build_node_state,
    idle_usage,
    release,
    reservation_from_assignment,
    to_pod_assignment,
)

from .builders import (
    A100_MIB,
    NODE,
    NOW,
    STALE_AFTER,
    gpu,
    held_mig,
    held_share,
    held_whole,
    inventory,
    node_of,
    usage,
)

L4X2 = inventory(gpu(0), gpu(1))
MIG_NODE = inventory(gpu(0, A100_MIB, "NVIDIA A100-SXM4-80GB", mig=("3g.40gb", "1g.10gb")))


@pytest.mark.parametrize(
    ("heartbeat", "offers"),
    [
        (NOW, True),
        (NOW - STALE_AFTER, True),
        (NOW - STALE_AFTER - timedelta(microseconds=1), False),
        (NOW + timedelta(minutes=5), True),
    ],
    ids=["now", "exactly stale_after ago", "just older", "from the future (clock skew)"],
)
def test_the_heartbeat_decides_whether_the_node_offers(heartbeat, offers):
    assert node_of(L4X2, heartbeat=heartbeat).offers is offers


def test_without_usage_the_node_offers_nothing():
    node = build_node_state(L4X2, None, (), NOW, STALE_AFTER)
    assert (node.offers, node.heartbeat) == (False, None)


def test_a_naive_now_is_refused():
    with pytest.raises(ContractError, match="now"):
        build_node_state(L4X2, usage(L4X2), (), datetime(2025, 3, 1), STALE_AFTER)


def test_free_memory_is_total_less_the_larger_of_assigned_and_measured():
    node = node_of(
        L4X2, [held_share(0, 4096, 10), held_share(1, 4096, 10)], used={0: 10000, 1: 1000}
    )
    assert [g.free_mib for g in node.gpus] == [24576 - 10000, 24576 - 4096]
    assert [(g.assigned_mib, g.assigned_cores, g.shares) for g in node.gpus] == [(4096, 10, 1)] * 2


def test_idle_means_nothing_assigned_and_little_measured():
    node = node_of(
        inventory(gpu(0), gpu(1), gpu(2)), [held_share(2, 1, 1)], used={1: IDLE_USED_MIB}
    )
    assert [g.idle for g in node.gpus] == [True, False, False]


def test_a_gpu_without_a_usage_sample_is_not_available():
    node = node_of(L4X2, missing=(1,))
    assert [g.available for g in node.gpus] == [True, False]


def test_gpus_are_in_index_order_whatever_the_inventory_order():
    node = node_of(inventory(gpu(1), gpu(0)))
    assert [g.index for g in node.gpus] == [0, 1]


def test_whole_and_mig_holders_are_counted():
    node = node_of(MIG_NODE, [held_mig("MIG-0-1", 0, "1g.10gb")])
    assert [s.taken for s in node.gpus[0].mig] == [False, True]
    held = node_of(L4X2, [held_whole(1)]).gpus[1]
    assert (held.holders, held.shares, held.free_mib, held.free_cores) == (1, 0, 0, 0)


def test_assignments_naming_what_the_node_lacks_are_reported_and_not_counted():
    ghost_gpu = PodAssignment(
        NODE, NOW, (ContainerAssignment("a", gpus=(AssignedGpu("GPU-9", 1024, 10),), shared=True),)
    )
    ghost_mig = held_mig("MIG-9-9", 0)
    elsewhere = PodAssignment("node-b", NOW, held_whole(0).containers)
    node = node_of(L4X2, [ghost_gpu, ghost_mig, elsewhere])
    assert node == node_of(L4X2)
    assert [(i.assignment, i.container, i.reason) for i in node.issues] == [
        (ghost_gpu, "a", "no GPU GPU-9 on node node-a"),
        (ghost_mig, "other", "no MIG MIG-9-9"),
        (elsewhere, "", "assigned to node 'node-b'"),
    ]


def test_clashing_assignments_are_reported_and_still_counted():
    first, second = held_whole(0), held_share(0, 1024, 10)
    node = node_of(L4X2, [first, second])
    assert [i.reason for i in node.issues] == ["GPU-0 (index 0) is already held whole"]
    assert node.gpus[0].assigned_mib == 24576 + 1024


def test_a_mig_instance_named_twice_is_reported():
    twice = held_mig("MIG-0-0", 0)
    node = node_of(MIG_NODE, [twice, twice])
    assert [i.reason for i in node.issues] == [
        "MIG instance MIG-0-0 on GPU-0 (index 0) is already taken"
    ]


def test_a_wrong_mig_parent_is_corrected_from_the_inventory():
    wrong = PodAssignment(
        NODE, NOW, (ContainerAssignment("a", mig=AssignedMig("MIG-0-0", "3g.40gb", "GPU-7")),)
    )
    (container,), issues = reservation_from_assignment(wrong, node_of(MIG_NODE))
    assert (container.mig.gpu_uuid, issues) == ("GPU-0", ())


def test_apply_then_release_gives_back_the_same_node():
    node = node_of(MIG_NODE)
    placements = held_mig("MIG-0-0", 0).containers
    assert release(apply(node, placements), placements) == node
    node = node_of(L4X2)
    placements = (*held_whole(0).containers, *held_share(1, 2048, 20).containers)
    assert release(apply(node, placements), placements) == node


@pytest.mark.parametrize(
    ("holders", "given_back", "reason"),
    [
        ((), held_whole(0), re.escape("GPU-0 (index 0) is not held whole")),
        ((), held_share(0, 1024, 10), re.escape("GPU-0 (index 0) holds no share to give back")),
        (
            (held_share(0, 1024, 10),),
            held_share(0, 2048, 10),
            "has less assigned than is given back",
        ),
        ((), held_whole(7), "no GPU GPU-7 on node node-a"),
    ],
    ids=["whole not held", "share not held", "more than held", "unknown GPU"],
)
def test_release_refuses_what_was_not_held(holders, given_back, reason):
    with pytest.raises(ContractError, match=reason):
        release(node_of(L4X2, holders), given_back.containers)


@pytest.mark.parametrize(
    ("holders", "placed", "reason"),
    [
        ((held_whole(0),), held_share(0, 1024, 10), "already held whole"),
        ((held_share(0, 1024, 10),), held_whole(0), "holds 1 shares and cannot be held whole"),
    ],
    ids=["share on a whole GPU", "whole on a shared GPU"],
)
def test_apply_refuses_to_mix_whole_and_shared(holders, placed, reason):
    with pytest.raises(ContractError, match=reason):
        apply(node_of(L4X2, holders), placed.containers)


def test_apply_refuses_a_taken_mig_instance_and_leaves_the_node_alone():
    node = node_of(MIG_NODE, [held_mig("MIG-0-0", 0)])
    with pytest.raises(ContractError, match="already taken"):
        apply(node, held_mig("MIG-0-0", 0).containers)
    assert node.gpus[0].mig[0].taken


def test_an_assignment_round_trips_through_a_reservation():
    placed = (*held_whole(0).containers, *held_share(1, 2048, 20, name="side").containers)
    assignment = to_pod_assignment(NODE, placed, NOW)
    assert (assignment.node, assignment.assigned_at, assignment.containers) == (NODE, NOW, placed)
    assert reservation_from_assignment(assignment, node_of(L4X2)) == (placed, ())


def test_idle_usage_makes_every_gpu_available_at_now():
    node = build_node_state(L4X2, idle_usage(L4X2, NOW), (), NOW, STALE_AFTER)
    assert node.offers and all(g.available and g.idle for g in node.gpus)
