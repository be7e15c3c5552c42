"""Time-slicing through the real kube-scheduler and the extender: a node whose device plugin
publishes ``timeSlices: 2`` advertises each GPU twice, two ``nvidia.com/gpu: 1`` pods share each
GPU, and a time-sliced GPU takes no share (nor a GPU holding a share a time slice)."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest
import yaml
from kubernetes import client

from e2e.cluster.processes import wait_until
from e2e.extender_support import (
    assigned_gpus,
    audit,
    bound,
    gpu_pod,
    idle_nodes,
    scheduling_failures,
    share_pod,
)
from e2e.operator_support import POOL_LABEL, SAMPLES, all_bound, create_service, in_pool
from infergrid import constants

pytestmark = pytest.mark.e2e

SLICES = 2
FULL = f"time-sliced: {SLICES} of {SLICES} time slices taken"


@pytest.fixture()
def sliced_node(cluster):
    """One KWOK node with two idle L4s, time-sliced twice, that only this test's pods name."""
    gpus = {"model": "NVIDIA L4", "count": 2, "memoryMiB": 23034, "smCount": 58,
            "computeCapability": "8.9"}  # fmt: skip
    suffix = uuid.uuid4().hex[:6]
    entry = {"name": f"ts-{suffix}", "gpus": gpus, "timeSlices": SLICES}
    with idle_nodes(cluster.api, [entry], {POOL_LABEL: suffix}) as (name,):
        yield name


def slice_pod(name: str, node: str) -> dict:
    return gpu_pod(name, {constants.RESOURCE_GPU: "1"}, node=node)


def waits_saying(core: client.CoreV1Api, namespace: str, name: str, text: str) -> str:
    """The FailedScheduling message of the Pending pod ``name`` that says ``text``."""

    def found() -> str | None:
        return next((m for m in scheduling_failures(core, namespace, name) if text in m), None)

    wait_until(found, 60, f"{name} refused: {text}")
    assert core.read_namespaced_pod(name, namespace).spec.node_name is None
    return found() or ""


def test_four_pods_share_two_gpus_two_each_and_a_fifth_and_a_share_wait(
    cluster, namespace, extender, sliced_node
):
    core = client.CoreV1Api(cluster.api)
    allocatable = core.read_node(sliced_node).status.allocatable
    assert allocatable[constants.RESOURCE_GPU] == str(2 * SLICES)  # node_capacity: GPUs x N
    names = [f"slice-{i}" for i in range(4)]
    for name in names:
        core.create_namespaced_pod(namespace, slice_pod(name, sliced_node))
    wait_until(lambda: bound(core, namespace, names), 120, "four time slices bound")
    placed = assigned_gpus(core, namespace, names)
    assert {node for node, _ in placed} == {sliced_node}
    assert sorted(Counter(gpu for _, gpu in placed).values()) == [SLICES, SLICES]
    audit(core)

    # Every time slice is taken: kube-scheduler's own count of the advertised nvidia.com/gpu
    # (GPUs x N) refuses the fifth before the extender is asked.
    core.create_namespaced_pod(namespace, slice_pod("fifth", sliced_node))
    waits_saying(core, namespace, "fifth", f"Insufficient {constants.RESOURCE_GPU}")

    # Share slots are still advertised; the extender refuses, naming each time-sliced GPU.
    core.create_namespaced_pod(namespace, share_pod("share", 4096, node=sliced_node))
    message = waits_saying(core, namespace, "share", FULL)
    for _, gpu in set(placed):
        assert f"{gpu} (index " in message
    audit(core)


def test_a_gpu_holding_a_share_takes_no_time_slice_and_the_extender_says_why(
    cluster, namespace, extender, sliced_node
):
    core = client.CoreV1Api(cluster.api)
    core.create_namespaced_pod(namespace, share_pod("share", 4096, node=sliced_node))
    wait_until(lambda: bound(core, namespace, ["share"]), 60, "the share bound")
    ((_, shared),) = assigned_gpus(core, namespace, ["share"])
    names = ["slice-0", "slice-1"]
    for name in names:
        core.create_namespaced_pod(namespace, slice_pod(name, sliced_node))
    wait_until(lambda: bound(core, namespace, names), 60, "two time slices bound")
    placed = {gpu for _, gpu in assigned_gpus(core, namespace, names)}
    assert len(placed) == 1 and shared not in placed

    # kube-scheduler sees two of four nvidia.com/gpu free; the extender sees no GPU to slice.
    core.create_namespaced_pod(namespace, slice_pod("third", sliced_node))
    message = waits_saying(core, namespace, "third", "0 of 2 GPUs have a time slice free")
    assert "needs 1: 1 with every time slice taken, 1 holding shares" in message
    audit(core)


def test_the_samples_four_replicas_take_the_two_time_slices_of_each_gpu(
    cluster, namespace, start_operator, sliced_node
):
    """deploy/samples/scheduling/time-slicing.yaml through the operator, on the pool of one."""
    start_operator()
    core = client.CoreV1Api(cluster.api)
    body = in_pool(yaml.safe_load((SAMPLES / "scheduling" / "time-slicing.yaml").read_text()),
                   sliced_node.rsplit("-", 1)[1])  # fmt: skip
    create_service(cluster.api, namespace, body)
    name, replicas = body["metadata"]["name"], body["spec"]["replicas"]

    wait_until(
        lambda: all_bound(cluster.api, namespace, name, replicas),
        120,
        f"{replicas} time-sliced replicas bound",
    )
    per_gpu = Counter(gpu for _, gpu in assigned_gpus(core, namespace))
    assert sorted(per_gpu.values()) == [SLICES, SLICES]
