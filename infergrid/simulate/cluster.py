"""The trace in the placement core's own types: nodes as NodeStates, pods as GPU requests.

The trace gives no GPU memory or SM count per model: a pod's ``gpu_milli`` is a
fraction of whichever GPU it lands on, and the paper treats every GPU as 1000
milli. So every simulated GPU is alike: ``GPU_MEMORY_MIB`` of memory (16 MiB per
milli-GPU, a 16 GB-class card like most of the trace's) and 100% of its SMs. A
share of ``gpu_milli`` asks for ``gpu_milli`` × 16 MiB and ``gpu_milli`` / 10
percent of the SMs (rounded up; the trace only has multiples of 10), so it fits
a GPU exactly when the GPU has that fraction of both free. A pod of 1000 milli
per GPU asks for whole GPUs. The model restricts nothing but ``gpu_spec``.

CPU and memory go in ``NodeState.host`` and ``HostRequest``: the paper's
simulator filters on them (kube-scheduler's NodeResourcesFit), and CPU enters
its best-fit, dot-product and fragmentation.

The replay takes pods as ``SimPod``s, already in the core's types, so a live
cluster's pods (``infergrid what-if``: shares in MiB, MIG, several containers)
replay through it as they are; ``sim_pod`` makes one of a trace pod.
"""

import math
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Final

from infergrid.constants import MAX_VGPU_SLOTS_PER_GPU
from infergrid.inventory import Gpu, GpuInventory
from infergrid.placement import HostRequest, HostResources, NodeState, build_node_state, idle_usage
from infergrid.pod_request import ContainerGpuRequest, PodGpuRequest
from infergrid.simulate.trace import MILLI_GPU, TraceNode, TracePod

MIB_PER_MILLI: Final = 16
GPU_MEMORY_MIB: Final = MILLI_GPU * MIB_PER_MILLI
PERCENT_PER_MILLI: Final = 10
CONTAINER: Final = "main"
_EPOCH: Final = datetime(2023, 7, 10, tzinfo=UTC)
"""The simulated clock: the heartbeat and "now" of every node; placement compares only them."""
_FRESH: Final = timedelta(days=1)
_COMPUTE_CAPABILITY: Final = "0.0"
"""The trace names no capability; placement never reads it."""


def node_state(node: TraceNode) -> NodeState:
    """The node with nothing placed, built by the core from an inventory as the extender's are."""
    inventory = inventory_of(node)
    state = build_node_state(inventory, idle_usage(inventory, _EPOCH), (), _EPOCH, _FRESH)
    return replace(state, host=HostResources(node.cpu_milli, node.memory_mib))


def inventory_of(node: TraceNode) -> GpuInventory:
    """The GPUs the node's device plugin would publish: ``node.gpus`` alike GPUs."""
    gpus = tuple(
        Gpu(
            uuid=f"{node.name}/gpu{index}",
            index=index,
            model=node.model,
            memory_mib=GPU_MEMORY_MIB,
            sm_count=100,
            compute_capability=_COMPUTE_CAPABILITY,
            numa_node=0,
            healthy=True,
        )
        for index in range(node.gpus)
    )
    return GpuInventory(node.name, gpus, share_slots=MAX_VGPU_SLOTS_PER_GPU)


def share_of(gpu_milli: int) -> tuple[int, int]:
    """(memory MiB, SM percent) of a share of ``gpu_milli`` thousandths of a GPU."""
    return gpu_milli * MIB_PER_MILLI, math.ceil(gpu_milli / PERCENT_PER_MILLI)


@dataclass(frozen=True, slots=True)
class SimPod:
    """A pod as the replay takes it: its name, its GPU request and what it asks of the node
    as the core reads them, and its GPU request in milli-GPUs, which the arrived and
    allocated % count (and a trace's arrivals inflate by)."""

    name: str
    request: PodGpuRequest
    host: HostRequest
    gpu_request_milli: int


def sim_pod(pod: TracePod) -> SimPod:
    """The trace pod in the core's types."""
    return SimPod(pod.name, *pod_request(pod), pod.gpu_request_milli)


def pod_request(pod: TracePod) -> tuple[PodGpuRequest, HostRequest]:
    """The pod as the core sees it: one container's GPU request, and what it asks of the node."""
    host = HostRequest(pod.cpu_milli, pod.memory_mib, pod.gpu_spec)
    if pod.num_gpu == 0:
        return PodGpuRequest(containers=()), host
    if pod.gpu_milli >= MILLI_GPU:
        container = ContainerGpuRequest(CONTAINER, "whole", gpus=pod.num_gpu)
    else:
        memory, cores = share_of(pod.gpu_milli)
        container = ContainerGpuRequest(CONTAINER, "share", gpus=1, memory_mib=memory, cores=cores)
    return PodGpuRequest(containers=(container,)), host
