"""Placement through infergrid-scheduler and the extender, on the local cluster."""

from __future__ import annotations

import threading
import uuid

import pytest
from kubernetes import client

from e2e.cluster import fake_nodes
from e2e.cluster.processes import wait_until
from e2e.extender_support import (
    assigned_gpus,
    audit,
    bound,
    gpu_pod,
    idle_nodes,
    now_utc,
    scheduling_failures,
    share_pod,
)
from infergrid import constants
from infergrid.assignment_annotation import decode_assignment
from infergrid.fleet import parse_fleet
from infergrid.inventory import decode_inventory, encode_inventory
from infergrid.usage import GpuUsage, GpuUsageSample, encode_usage

pytestmark = pytest.mark.e2e


@pytest.fixture()
def lone_gpu_node(cluster):
    """A KWOK node with one 24 GiB GPU whose annotations the test writes itself."""
    core = client.CoreV1Api(cluster.api)
    name = f"gpu24-{uuid.uuid4().hex[:6]}"
    doc = {
        "version": "v1",
        "nodes": [{"name": name, "gpus": {"model": "NVIDIA A10", "count": 1, "memoryMiB": 24576,
                                         "smCount": 72, "computeCapability": "8.6"}}],
    }  # fmt: skip
    fleet = parse_fleet(doc, "test")
    fake_nodes.create(cluster.api, fleet)
    inventory = fleet.nodes[0].inventory

    def publish(used_mib: int = 0) -> None:
        usage = GpuUsage(name, now_utc(), (GpuUsageSample(inventory.gpus[0].uuid, used_mib, 0),))
        annotations = {
            constants.ANNOTATION_GPU_INVENTORY: encode_inventory(inventory),
            constants.ANNOTATION_GPU_USAGE: encode_usage(usage),
        }
        core.patch_node(name, {"metadata": {"annotations": annotations}})

    publish()
    wait_until(lambda: fake_nodes._schedulable(core.read_node(name)), 60, f"{name} Ready")
    yield name, publish
    core.delete_node(name)


@pytest.fixture()
def two_fresh_nodes(cluster):
    """Two KWOK nodes with two idle 24 GiB GPUs each, that only this test's pods may use."""
    suffix = uuid.uuid4().hex[:6]
    gpus = {"model": "NVIDIA A10", "count": 2, "memoryMiB": 24576, "smCount": 72,
            "computeCapability": "8.6"}  # fmt: skip
    entries = [{"name": f"pair{i}-{suffix}", "gpus": gpus} for i in range(2)]
    with idle_nodes(cluster.api, entries) as names:
        yield names


def burst_on(core, namespace: str, nodes: list[str], policy: str, count: int) -> list[str]:
    """`count` 4 GiB shares with `policy`, created back to back, allowed on `nodes` only;
    returns the GPU each one got."""
    names = [f"{policy}-{i}" for i in range(count)]
    for name in names:
        pod = share_pod(name, 4096, annotations={constants.ANNOTATION_PLACEMENT_POLICY: policy})
        only_these = {"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}
        pod["spec"]["affinity"] = {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [only_these]}]}}}  # fmt: skip
        core.create_namespaced_pod(namespace, pod)
    wait_until(lambda: bound(core, namespace, names), 120, f"the {policy} burst bound")
    gpus = [uuid for _, uuid in assigned_gpus(core, namespace, names)]
    assert len(gpus) == count, gpus  # one GPU share each
    return gpus


def test_a_burst_of_spread_shares_takes_a_gpu_each_and_a_binpack_burst_fills_one(
    cluster, namespace, extender, two_fresh_nodes
):
    """kube-scheduler binds asynchronously: each pod of a burst is placed while the bind of the
    one before may still be on its way. By default prioritize holds each pod's placement (a
    tentative reservation) until its bind, so every pod is placed knowing where the earlier
    ones went."""
    bursts_keep_their_policy(client.CoreV1Api(cluster.api), namespace, two_fresh_nodes)


def test_with_the_wait_instead_of_holds_a_burst_is_placed_as_well(
    cluster, namespace, extender, two_fresh_nodes
):
    """The older way: no holds, and a filter waits for the binds of the pods before it."""
    default_args = extender.args
    extender.stop()
    extender.args = ["--tentative-reservation", "0", "--bind-wait", "2"]
    extender.start()
    try:
        bursts_keep_their_policy(client.CoreV1Api(cluster.api), namespace, two_fresh_nodes)
    finally:
        extender.stop()
        extender.args = default_args
        extender.start()


def bursts_keep_their_policy(core, namespace: str, nodes: list[str]) -> None:
    spread = burst_on(core, namespace, nodes, constants.POLICY_SPREAD, 4)
    assert len(set(spread)) == 4, spread  # the emptiest node each time, then its emptiest GPU
    binpack = burst_on(core, namespace, nodes, constants.POLICY_BINPACK, 4)
    assert len(set(binpack)) == 1, binpack  # 4 + 16 GiB of one 24 GiB GPU
    audit(core)


def test_three_8gib_shares_fit_one_24gib_gpu_and_a_fourth_waits_with_the_reason(
    cluster, namespace, extender, lone_gpu_node
):
    core = client.CoreV1Api(cluster.api)
    node, _ = lone_gpu_node
    names = ["share-1", "share-2", "share-3"]
    for n in names:
        core.create_namespaced_pod(namespace, share_pod(n, 8192, node=node))
    wait_until(lambda: bound(core, namespace, names), 60, "three shares bound")
    core.create_namespaced_pod(namespace, share_pod("share-4", 8192, node=node))
    wait_until(
        lambda: any("needs 8192" in m for m in scheduling_failures(core, namespace, "share-4")),
        60,
        "a FailedScheduling event naming the memory shortfall",
    )
    assert core.read_namespaced_pod("share-4", namespace).spec.node_name is None
    message = next(m for m in scheduling_failures(core, namespace, "share-4") if "needs" in m)
    assert "0 MiB free, needs 8192" in message
    audit(core)


def test_memory_used_outside_assignments_shrinks_what_is_offered(
    cluster, namespace, extender, lone_gpu_node
):
    core = client.CoreV1Api(cluster.api)
    node, publish = lone_gpu_node
    publish(used_mib=20480)  # something outside Kubernetes holds 20 GiB
    core.create_namespaced_pod(namespace, share_pod("big", 8192, node=node))
    wait_until(
        lambda: any("4096 MiB free" in m for m in scheduling_failures(core, namespace, "big")),
        60,
        "the measured use in the rejection",
    )
    core.create_namespaced_pod(namespace, share_pod("small", 4096, node=node))
    wait_until(lambda: bound(core, namespace, ["small"]), 60, "the 4 GiB share bound")


def test_two_gpus_with_nvlink_topology_land_on_an_nvlink_pair(cluster, namespace, extender):
    core = client.CoreV1Api(cluster.api)
    pod = gpu_pod(
        "pair",
        {constants.RESOURCE_GPU: "2"},
        annotations={constants.ANNOTATION_TOPOLOGY: constants.TOPOLOGY_NVLINK},
    )
    core.create_namespaced_pod(namespace, pod)
    wait_until(lambda: bound(core, namespace, ["pair"]), 60, "the NVLink pod bound")
    live = core.read_namespaced_pod("pair", namespace)
    assignment = decode_assignment(live.metadata.annotations[constants.ANNOTATION_GPU_ASSIGNMENT])
    (container,) = assignment.containers
    a, b = (g.uuid for g in container.gpus)
    node = core.read_node(live.spec.node_name)
    gpus = {
        g.uuid: g
        for g in decode_inventory(
            node.metadata.annotations[constants.ANNOTATION_GPU_INVENTORY]
        ).gpus
    }
    links = [link for link in gpus[a].links if link.peer_index == gpus[b].index]
    assert links and links[0].type == constants.LINK_NVLINK


def test_200_pods_at_once_are_all_placed_without_over_commit(cluster, namespace, extender):
    core = client.CoreV1Api(cluster.api)
    names = [f"burst-{i:03d}" for i in range(200)]
    for i, n in enumerate(names):
        limits = (
            {constants.RESOURCE_GPU: "1"}
            if i % 50 == 0
            else {constants.RESOURCE_VGPU: "1", constants.RESOURCE_GPU_MEMORY: "2048"}
        )
        core.create_namespaced_pod(namespace, gpu_pod(n, limits))
    wait_until(lambda: bound(core, namespace, names), 240, "all 200 pods bound")
    placed = audit(core)
    assert sum(placed.values()) >= 200


def test_killing_the_extender_mid_stream_leaves_no_double_allocation(cluster, namespace, extender):
    core = client.CoreV1Api(cluster.api)
    names = [f"churn-{i:02d}" for i in range(60)]
    created = threading.Event()

    def create() -> None:
        for n in names:
            core.create_namespaced_pod(namespace, share_pod(n, 6144))
        created.set()

    creator = threading.Thread(target=create)
    creator.start()
    wait_until(lambda: sum(bound(core, namespace, [n]) for n in names[:10]) >= 5, 120, "a start")
    extender.kill()
    creator.join()
    audit(core)  # what was bound before the crash is consistent
    extender.start()
    wait_until(lambda: bound(core, namespace, names), 240, "every pod bound after the restart")
    audit(core)


def test_a_pod_with_an_impossible_request_waits_with_the_field_named(cluster, namespace, extender):
    core = client.CoreV1Api(cluster.api)
    pod = gpu_pod("bad", {constants.RESOURCE_VGPU: "1"})
    core.create_namespaced_pod(namespace, pod)
    wait_until(
        lambda: any(
            "infergrid.io/gpu-memory" in m for m in scheduling_failures(core, namespace, "bad")
        ),
        60,
        "the invalid request in the event",
    )


def test_a_pod_naming_an_unknown_policy_waits_with_the_annotation_named(
    cluster, namespace, extender
):
    """Never placed by another policy: every node refuses it, naming the annotation."""
    core = client.CoreV1Api(cluster.api)
    pod = share_pod("densest", 4096, annotations={constants.ANNOTATION_PLACEMENT_POLICY: "densest"})
    core.create_namespaced_pod(namespace, pod)
    wait_until(
        lambda: any(
            "'densest' is not one of" in m for m in scheduling_failures(core, namespace, "densest")
        ),
        60,
        "a FailedScheduling event naming the unknown policy",
    )
    message = next(m for m in scheduling_failures(core, namespace, "densest") if "densest" in m)
    assert constants.ANNOTATION_PLACEMENT_POLICY in message
    assert constants.POLICY_FGD_CLUSTER_AWARE in message
    assert core.read_namespaced_pod("densest", namespace).spec.node_name is None


def test_a_burst_asking_for_fgd_cluster_aware_is_placed_without_over_commit(
    cluster, namespace, extender, two_fresh_nodes
):
    """The simulator's best policy is one a pod can ask for by name."""
    core = client.CoreV1Api(cluster.api)
    placed = burst_on(core, namespace, two_fresh_nodes, constants.POLICY_FGD_CLUSTER_AWARE, 4)
    assert len(placed) == 4
    audit(core)
