"""Nodes and pods as every InferGrid reader sees them: their GPU annotations, decoded.

The extender's watch cache, the device plugin and `infergrid placements` all read
the same Kubernetes JSON. Decoding it here, once, means they agree on which pods
still hold GPUs and on which annotations count, so the table a person prints is
what the extender offers and the pods the plugin honours are the ones it placed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final, TypeVar

from infergrid.assignment_annotation import PodAssignment, decode_assignment
from infergrid.constants import (
    ANNOTATION_GPU_ASSIGNMENT,
    ANNOTATION_GPU_INVENTORY,
    ANNOTATION_GPU_USAGE,
    RESOURCE_GPU,
    RESOURCE_MIG_PREFIX,
    RESOURCE_VGPU,
)
from infergrid.dra_slices import DraDevice, SliceRecord, idle_usage, pool_inventory
from infergrid.errors import ContractError
from infergrid.inventory import GpuInventory, decode_inventory
from infergrid.placement.host import HostRequest
from infergrid.pod_host import mib_rounded_up, parse_host_request
from infergrid.quantity import parse_milli_quantity, parse_whole_quantity
from infergrid.usage import GpuUsage, decode_usage

TERMINAL_PHASES: Final = ("Succeeded", "Failed")
"""A pod in one of these phases has stopped for good: its GPUs are free again."""
LIVE_PODS: Final = ",".join(f"status.phase!={phase}" for phase in TERMINAL_PHASES)
"""The field selector for live pods: a pod leaving it arrives in a watch as DELETED."""
DEFAULT_SCHEDULER: Final = "default-scheduler"
"""Kubernetes' scheduler for a pod that names none."""

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """A node's GPU annotations, decoded; a node with a ``problem`` offers nothing."""

    name: str
    inventory: GpuInventory | None
    usage: GpuUsage | None
    problem: str | None
    cpu_milli: int = 0
    """Allocatable CPU in millicores (0 where the node reports none readable)."""
    memory_mib: int = 0
    """Allocatable memory in MiB (0 where the node reports none readable)."""
    dra: bool = False
    """Its GPUs are offered through DRA (ResourceSlices), not the device plugin."""


BOTH_MODES: Final = "offers its GPUs both through the device plugin and DRA"


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    """A container's count of one resource the device plugin hands out as devices.

    The plugin reads these to see a pod that waits for its devices without an
    assignment: the kubelet's Allocate names devices, not pods, so such a pod could
    be mistaken for one that holds an assignment to the same devices.
    """

    container: str
    resource: str
    count: int


@dataclass(frozen=True, slots=True)
class PodRecord:
    """A pod and the assignment in its annotation, if one decodes (else ``problem`` says why)."""

    uid: str
    namespace: str
    name: str
    node_name: str | None
    scheduler_name: str
    assignment: PodAssignment | None
    problem: str | None = None
    phase: str = ""
    resource_version: str = ""
    cpu_milli: int = 0
    """The pod's effective CPU request in millicores, as kube-scheduler counts it."""
    memory_mib: int = 0
    """The pod's effective memory request in MiB."""
    priority: int = 0
    """``spec.priority``, which the API server fills from the pod's PriorityClass."""
    device_requests: tuple[DeviceRequest, ...] = ()
    """What its containers (init containers first) ask of the device plugin's resources."""
    priority_class: str = ""
    """``spec.priorityClassName`` ("" for none): the extender evicts only preemptible classes."""

    @property
    def key(self) -> str:
        """``namespace/name``, as people and kubectl name the pod."""
        return f"{self.namespace}/{self.name}"


def node_record(node: dict[str, Any]) -> NodeRecord:
    """The record of a Node's JSON; a bad annotation becomes ``problem``, never an exception.

    An inventory or usage naming another node is a problem too: copied
    annotations would otherwise offer one node's GPUs under two names.
    """
    meta = node.get("metadata") or {}
    name = meta["name"]
    annotations = meta.get("annotations") or {}
    inventory, bad_inventory = _decoded(annotations, ANNOTATION_GPU_INVENTORY, decode_inventory)
    usage, bad_usage = _decoded(annotations, ANNOTATION_GPU_USAGE, decode_usage)
    problems = [p for p in (bad_inventory, bad_usage) if p]
    for key, doc in ((ANNOTATION_GPU_INVENTORY, inventory), (ANNOTATION_GPU_USAGE, usage)):
        if doc is not None and doc.node != name:
            problems.append(f"{key}: node: names {doc.node!r}, not this node {name!r}")
    cpu, memory = _allocatable(node)
    return NodeRecord(name, inventory, usage, "; ".join(problems) or None, cpu, memory)


def with_slices(
    record: NodeRecord, slices: Iterable[SliceRecord]
) -> tuple[NodeRecord, Mapping[str, DraDevice]]:
    """The node's record once its ResourceSlices of InferGrid's driver are read, and their
    devices by name (empty where it has none).

    A node with slices is a DRA node: its inventory is theirs, and nothing measures its
    use beside the claims (``idle_usage``). A node that also publishes the device plugin's
    inventory is a problem and offers nothing: the two would hand out the same GPUs. Bad
    or incomplete slices are a problem too.
    """
    slices = list(slices)
    if not slices:
        return record, {}
    if record.inventory is not None or record.problem:
        problem = "; ".join(p for p in (record.problem, f"node {record.name} {BOTH_MODES}") if p)
        return replace(record, inventory=None, usage=None, problem=problem, dra=True), {}
    try:
        inventory, devices = pool_inventory(record.name, slices)
    except ContractError as err:
        return replace(record, usage=None, problem=str(err), dra=True), {}
    return replace(record, inventory=inventory, usage=idle_usage(inventory), dra=True), devices


def _allocatable(node: dict[str, Any]) -> tuple[int, int]:
    """The node's allocatable CPU (millicores) and memory (MiB); 0 where absent or
    unreadable, which only leaves fgd and fgd-cluster-aware without the node's CPU (the
    API server validates quantities, so this is for hand-made objects)."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    try:
        cpu = parse_milli_quantity(allocatable.get("cpu", 0), "status.allocatable.cpu")
        memory = parse_whole_quantity(allocatable.get("memory", 0), "status.allocatable.memory")
    except ContractError:
        return 0, 0
    return cpu, mib_rounded_up(memory)


def pod_record(pod: dict[str, Any]) -> PodRecord:
    """The record of a Pod's JSON; a bad assignment becomes ``problem``, never an exception."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    annotations = meta.get("annotations") or {}
    assignment, problem = _decoded(annotations, ANNOTATION_GPU_ASSIGNMENT, decode_assignment)
    try:
        host = parse_host_request(pod)
    except ContractError:
        host = HostRequest()  # the API server validates quantities: hand-made objects only
    return PodRecord(
        uid=meta["uid"],
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        node_name=spec.get("nodeName") or None,
        scheduler_name=spec.get("schedulerName") or DEFAULT_SCHEDULER,
        assignment=assignment,
        problem=problem,
        phase=(pod.get("status") or {}).get("phase", ""),
        resource_version=meta.get("resourceVersion", ""),
        cpu_milli=host.cpu_milli,
        memory_mib=host.memory_mib,
        priority=pod_priority(pod),
        priority_class=str(spec.get("priorityClassName") or ""),
        device_requests=device_requests(spec),
    )


def is_device_resource(resource: str) -> bool:
    """Whether the device plugin serves ``resource``: whole GPUs, shares or a MIG profile.

    ``infergrid.io/gpu-memory`` and ``gpu-cores`` size a share but are no devices.
    """
    return resource in (RESOURCE_GPU, RESOURCE_VGPU) or resource.startswith(RESOURCE_MIG_PREFIX)


def device_requests(spec: dict[str, Any]) -> tuple[DeviceRequest, ...]:
    """Each container's device resources, read from limits as the kubelet's device manager
    reads them (the API server requires limits for extended resources and sets requests
    equal). A count that does not parse is left out: the API server validates quantities,
    so only hand-made objects carry one."""
    found = []
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or []:
            limits = (container.get("resources") or {}).get("limits") or {}
            for resource, raw in limits.items():
                if not is_device_resource(resource):
                    continue
                try:
                    count = parse_whole_quantity(raw, f"{key}.resources.limits.{resource}")
                except ContractError:
                    continue
                if count > 0:
                    found.append(DeviceRequest(container.get("name", ""), resource, count))
    return tuple(found)


def pod_priority(pod: dict[str, Any]) -> int:
    """``spec.priority``; 0 (the default class's) where it is absent or not an integer."""
    value = (pod.get("spec") or {}).get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def is_live(pod: PodRecord) -> bool:
    """Whether the pod may still hold GPUs: it has not finished, whatever its containers do."""
    return pod.phase not in TERMINAL_PHASES


def _decoded(
    annotations: dict[str, str], key: str, decode: Callable[[str], T]
) -> tuple[T | None, str | None]:
    """The decoded annotation, or the reason it does not decode, prefixed with its key."""
    text = annotations.get(key)
    if text is None:
        return None, None
    try:
        return decode(text), None
    except ContractError as err:
        return None, str(err) if err.field.startswith(key) else f"{key}: {err}"
