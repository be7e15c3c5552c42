"""A pod left with its own assignment and no Binding is judged without what it holds itself.

Bind writes the assignment, then creates the Binding. An extender killed between the two (or
an API server that fails the Binding and the undo) leaves an unbound pod whose assignment the
cache counts as holding its GPUs; kube-scheduler asks about the pod again. Judged with its own
holding, it would find no room on a node that only it fills and wait forever.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from infergrid.assignment_annotation import (
    AssignedGpu,
    ContainerAssignment,
    PodAssignment,
    encode_assignment,
)
from infergrid.constants import (
    ANNOTATION_GPU_ASSIGNMENT,
    ANNOTATION_GPU_INVENTORY,
    ANNOTATION_GPU_USAGE,
    POLICY_BINPACK,
    RESOURCE_GPU_MEMORY,
    RESOURCE_VGPU,
    SCHEDULER_NAME,
)
from infergrid.fleet import parse_fleet
from infergrid.inventory import encode_inventory
from infergrid.placement import idle_usage
from infergrid.usage import encode_usage
from scheduler_extender.decisions import filter_nodes
from scheduler_extender.view import PlacementView
from scheduler_extender.watch_cache import ADDED, ClusterCache

NOW = datetime.now(UTC)
NODE = "a10"
A10 = {"model": "NVIDIA A10", "count": 1, "memoryMiB": 24576, "smCount": 72,
       "computeCapability": "8.6"}  # fmt: skip
FLEET = parse_fleet({"version": "v1", "nodes": [{"name": NODE, "gpus": A10}]}, "test")
INVENTORY = FLEET.nodes[0].inventory
GPU = INVENTORY.gpus[0].uuid


def cache_with(*pods: dict) -> PlacementView:
    cache = ClusterCache()
    annotations = {
        ANNOTATION_GPU_INVENTORY: encode_inventory(INVENTORY),
        ANNOTATION_GPU_USAGE: encode_usage(idle_usage(INVENTORY, NOW)),
    }
    cache.apply_node(ADDED, {"metadata": {"name": NODE, "annotations": annotations}})
    for pod in pods:
        cache.apply_pod(ADDED, pod)
    return PlacementView(cache, timedelta(seconds=30))


def share(uid: str, mib: int, held_mib: int | None = None, bound: bool = False) -> dict:
    """A pod asking a `mib` share; `held_mib`: its assignment on the GPU already recorded."""
    annotations = {}
    if held_mib is not None:
        held = ContainerAssignment("engine", (AssignedGpu(GPU, held_mib, 0),), shared=True)
        annotations[ANNOTATION_GPU_ASSIGNMENT] = encode_assignment(
            PodAssignment(NODE, NOW, (held,))
        )
    limits = {RESOURCE_VGPU: "1", RESOURCE_GPU_MEMORY: str(mib)}
    spec = {"schedulerName": SCHEDULER_NAME,
            "containers": [{"name": "engine", "resources": {"limits": limits}}]}  # fmt: skip
    if bound:
        spec["nodeName"] = NODE
    meta = {"uid": uid, "name": uid, "namespace": "ns", "annotations": annotations}
    return {"metadata": meta, "spec": spec}


def test_an_unbound_pod_passes_the_node_that_only_its_own_assignment_fills():
    left = share("left", 16384, held_mib=16384)
    found = filter_nodes(left, [NODE], cache_with(left), POLICY_BINPACK, NOW)
    assert (found.passed, found.failed, found.categories) == ([NODE], {}, [])


def test_another_pod_still_finds_that_room_taken():
    left, other = share("left", 16384, held_mib=16384), share("other", 16384)
    found = filter_nodes(other, [NODE], cache_with(left, other), POLICY_BINPACK, NOW)
    assert found.passed == []
    assert "8192 MiB free, needs 16384" in found.failed[NODE]


def test_its_own_holding_is_set_aside_but_others_still_count():
    """It holds 4 GiB, another pod 16 GiB: without its own, 8 GiB are free, not the 16 it
    asks now."""
    left, other = share("left", 16384, held_mib=4096), share("other", 16384, 16384, bound=True)
    found = filter_nodes(left, [NODE], cache_with(left, other), POLICY_BINPACK, NOW)
    assert found.passed == []
    assert "needs 16384" in found.failed[NODE]


def test_a_bound_pod_is_not_judged_again_without_its_holding():
    """Only an unbound pod's assignment is one a bind left half done."""
    bound = share("bound", 16384, held_mib=16384, bound=True)
    found = filter_nodes(bound, [NODE], cache_with(bound), POLICY_BINPACK, NOW)
    assert found.passed == []
