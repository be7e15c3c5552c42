"""Node and pod records: how every reader decodes the GPU annotations of Kubernetes JSON.

The extender's watch cache, the device plugin and `infergrid placements` share these
records, so what is specified here holds for all three.
"""

from datetime import UTC, datetime

import pytest

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
    RESOURCE_GPU,
    RESOURCE_GPU_CORES,
    RESOURCE_GPU_MEMORY,
    RESOURCE_VGPU,
)
from infergrid.inventory import Gpu, GpuInventory, encode_inventory
from infergrid.records import (
    DEFAULT_SCHEDULER,
    LIVE_PODS,
    TERMINAL_PHASES,
    DeviceRequest,
    NodeRecord,
    is_live,
    node_record,
    pod_record,
)
from infergrid.usage import GpuUsage, GpuUsageSample, encode_usage

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def inventory(node: str) -> GpuInventory:
    return GpuInventory(node, (Gpu(f"GPU-{node}", 0, "NVIDIA L4", 23034, 58, "8.9", 0, True),))


def usage(node: str, used: int = 0) -> GpuUsage:
    return GpuUsage(node, NOW, (GpuUsageSample(f"GPU-{node}", used, 0),))


def assignment(node: str) -> PodAssignment:
    share = ContainerAssignment("main", (AssignedGpu(f"GPU-{node}", 1024, 10),), shared=True)
    return PodAssignment(node, NOW, (share,))


def node_json(name: str, annotations: dict[str, str] | None = None) -> dict:
    return {"metadata": {"name": name, "annotations": annotations}}


def gpu_node(name: str, inventory_of: str | None = None, usage_of: str | None = None) -> dict:
    """A GPU node whose annotations describe ``inventory_of`` and ``usage_of`` (itself)."""
    return node_json(
        name,
        {
            ANNOTATION_GPU_INVENTORY: encode_inventory(inventory(inventory_of or name)),
            ANNOTATION_GPU_USAGE: encode_usage(usage(usage_of or name, 300)),
        },
    )


def pod_json(held: PodAssignment | str | None = None, phase: str = "Running") -> dict:
    annotations = {}
    if held is not None:
        text = held if isinstance(held, str) else encode_assignment(held)
        annotations[ANNOTATION_GPU_ASSIGNMENT] = text
    return {
        "metadata": {
            "uid": "u1",
            "namespace": "ns",
            "name": "pod",
            "resourceVersion": "7",
            "annotations": annotations,
        },
        "spec": {"schedulerName": "infergrid-scheduler", "nodeName": "node-a"},
        "status": {"phase": phase},
    }


# Nodes.


def test_a_gpu_node_is_decoded():
    record = node_record(gpu_node("node-a"))
    assert record == NodeRecord("node-a", inventory("node-a"), usage("node-a", 300), None)


def test_a_node_without_annotations_has_nothing_and_no_problem():
    assert node_record(node_json("cpu-0")) == NodeRecord("cpu-0", None, None, None)


@pytest.mark.parametrize(
    ("cpu", "memory", "host"),
    [("16", "64Gi", (16000, 65536)), ("7500m", "1000Ki", (7500, 1)), (None, None, (0, 0)),
     ("x", "1Gi", (0, 0))],
)  # fmt: skip
def test_a_node_carries_its_allocatable_cpu_and_memory_and_bad_ones_count_as_none(
    cpu, memory, host
):
    node = gpu_node("node-a")
    if cpu is not None:
        node["status"] = {"allocatable": {"cpu": cpu, "memory": memory}}
    record = node_record(node)
    assert (record.cpu_milli, record.memory_mib) == host and record.problem is None


def test_a_pod_carries_its_cpu_and_memory_requests_and_bad_ones_count_as_none():
    pod = pod_json()
    pod["spec"]["containers"] = [{"name": "c", "resources": {"requests": {"cpu": "1500m"}}}]
    assert (pod_record(pod).cpu_milli, pod_record(pod).memory_mib) == (1500, 0)
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    assert pod_record(pod).cpu_milli == 0


def test_a_pod_carries_each_containers_device_resources_from_its_limits():
    """What the kubelet's device manager allocates: limits of the resources the plugin
    serves, init containers first; a share's memory and cores are no devices."""
    pod = pod_json()
    pod["spec"]["initContainers"] = [
        {"name": "warm", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}
    ]
    pod["spec"]["containers"] = [
        {"name": "a", "resources": {"limits": {RESOURCE_GPU: "2", "cpu": "1"}}},
        {"name": "b", "resources": {"limits": {RESOURCE_VGPU: "1", RESOURCE_GPU_MEMORY: "20k",
                                                 RESOURCE_GPU_CORES: "30"}}},
        {"name": "cpu-only", "resources": {"requests": {"cpu": "1"}}},
    ]  # fmt: skip
    assert pod_record(pod).device_requests == (
        DeviceRequest("warm", "nvidia.com/mig-1g.10gb", 1),
        DeviceRequest("a", RESOURCE_GPU, 2),
        DeviceRequest("b", RESOURCE_VGPU, 1),
    )


@pytest.mark.parametrize("count", ["0", "lots"])
def test_a_zero_or_unreadable_device_count_asks_for_nothing(count):
    pod = pod_json()
    pod["spec"]["containers"] = [{"name": "a", "resources": {"limits": {RESOURCE_GPU: count}}}]
    assert pod_record(pod).device_requests == ()


def test_a_pod_without_containers_asks_for_no_devices():
    assert pod_record(pod_json()).device_requests == ()


@pytest.mark.parametrize(
    "annotation, text, problem",
    [
        (ANNOTATION_GPU_INVENTORY, "{", f"{ANNOTATION_GPU_INVENTORY}: not valid JSON"),
        (ANNOTATION_GPU_INVENTORY, '{"version":"v1"}', f"{ANNOTATION_GPU_INVENTORY}: gpus:"),
        (ANNOTATION_GPU_USAGE, '{"version":"v9"}', f"{ANNOTATION_GPU_USAGE}: version:"),
    ],
)
def test_a_bad_annotation_is_a_problem_not_an_exception(annotation, text, problem):
    node = gpu_node("node-a")
    node["metadata"]["annotations"][annotation] = text
    record = node_record(node)
    assert record.problem.startswith(problem)
    assert getattr(record, annotation.rsplit("-", 1)[1]) is None


def test_both_bad_annotations_are_both_reported():
    bad = {ANNOTATION_GPU_INVENTORY: "[]", ANNOTATION_GPU_USAGE: "{"}
    problem = node_record(node_json("node-a", bad)).problem
    assert ANNOTATION_GPU_INVENTORY in problem and ANNOTATION_GPU_USAGE in problem


@pytest.mark.parametrize(
    "node, annotation",
    [
        (gpu_node("node-z", inventory_of="node-a"), ANNOTATION_GPU_INVENTORY),
        (gpu_node("node-z", inventory_of="node-z", usage_of="node-a"), ANNOTATION_GPU_USAGE),
    ],
    ids=["inventory", "usage"],
)
def test_an_annotation_naming_another_node_is_a_problem(node, annotation):
    """Copied annotations must not offer one node's GPUs under two names."""
    problem = node_record(node).problem
    assert f"{annotation}: node: names 'node-a', not this node 'node-z'" in problem


# Pods.


def test_a_pod_is_decoded():
    record = pod_record(pod_json(assignment("node-a")))
    assert (record.uid, record.key, record.node_name) == ("u1", "ns/pod", "node-a")
    assert (record.scheduler_name, record.phase, record.resource_version) == (
        "infergrid-scheduler",
        "Running",
        "7",
    )
    assert record.assignment == assignment("node-a") and record.problem is None


def test_a_pod_without_scheduler_or_node_has_kubernetes_defaults():
    pod = pod_json()
    pod["spec"] = {}
    record = pod_record(pod)
    assert (record.scheduler_name, record.node_name, record.assignment) == (
        DEFAULT_SCHEDULER,
        None,
        None,
    )


def test_a_bad_assignment_is_a_problem_and_holds_nothing():
    record = pod_record(pod_json('{"version":"v1"}'))
    assert record.assignment is None
    assert record.problem.startswith(f"{ANNOTATION_GPU_ASSIGNMENT}: containers:")


@pytest.mark.parametrize("phase", ["Pending", "Running", "Unknown", ""])
def test_a_pod_that_has_not_finished_is_live(phase):
    assert is_live(pod_record(pod_json(assignment("node-a"), phase=phase)))


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_finished_pod_is_not_live(phase):
    assert not is_live(pod_record(pod_json(assignment("node-a"), phase=phase)))


def test_the_live_selector_excludes_exactly_the_terminal_phases():
    assert LIVE_PODS.split(",") == [f"status.phase!={p}" for p in TERMINAL_PHASES]
