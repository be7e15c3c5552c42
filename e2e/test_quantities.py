"""GPU quantities as the API server really stores them: canonical, and still read right."""

from __future__ import annotations

import uuid

import pytest
from kubernetes import client

from e2e.cluster.processes import wait_until
from e2e.extender_support import audit, bound, idle_nodes, share_pod
from infergrid import constants
from infergrid.assignment_annotation import decode_assignment
from infergrid.pod_request import parse_pod_request
from infergrid.quantity import parse_whole_quantity

pytestmark = pytest.mark.e2e


@pytest.fixture()
def thousand_slot_node(cluster):
    """A KWOK node with eight idle 24 GiB GPUs of 125 share slots each: 1000 slots in all."""
    gpus = {"model": "NVIDIA A10", "count": 8, "memoryMiB": 24576, "smCount": 72,
            "computeCapability": "8.6"}  # fmt: skip
    entry = {"name": f"slots-{uuid.uuid4().hex[:6]}", "vgpuSlotsPerGpu": 125, "gpus": gpus}
    with idle_nodes(cluster.api, [entry]) as (name,):
        yield name


def test_node_capacity_of_1000_share_slots_is_stored_as_1k_and_read_as_1000(
    cluster, thousand_slot_node
):
    capacity = client.CoreV1Api(cluster.api).read_node(thousand_slot_node).status.capacity
    assert capacity[constants.RESOURCE_VGPU] == "1k"
    assert parse_whole_quantity(capacity[constants.RESOURCE_VGPU], "capacity") == 1000
    assert parse_whole_quantity(capacity[constants.RESOURCE_GPU], "capacity") == 8


def test_a_share_of_20000_mib_is_stored_as_20k_and_scheduled_with_20000(
    cluster, namespace, extender, thousand_slot_node
):
    core = client.CoreV1Api(cluster.api)
    core.create_namespaced_pod(namespace, share_pod("twenty-k", 20000, node=thousand_slot_node))
    stored = core.read_namespaced_pod("twenty-k", namespace)
    assert stored.spec.containers[0].resources.limits[constants.RESOURCE_GPU_MEMORY] == "20k"
    as_json = core.api_client.sanitize_for_serialization(stored)
    (asked,) = parse_pod_request(as_json).containers
    assert (asked.kind, asked.memory_mib) == ("share", 20000)

    wait_until(lambda: bound(core, namespace, ["twenty-k"]), 60, "the 20k share bound")
    live = core.read_namespaced_pod("twenty-k", namespace)
    assert live.spec.node_name == thousand_slot_node
    assignment = decode_assignment(live.metadata.annotations[constants.ANNOTATION_GPU_ASSIGNMENT])
    ((gpu,),) = [c.gpus for c in assignment.containers]
    assert gpu.memory_mib == 20000
    audit(core)
