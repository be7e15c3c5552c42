"""Placing one container on a node: whole GPUs, a share of one, or a MIG instance.

Each placer either returns the container's placement (a ``ContainerAssignment``)
or every shortfall that kept it out. They only read the node; ``fit`` reserves.
"""

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Final

from infergrid.assignment_annotation import AssignedGpu, AssignedMig, ContainerAssignment
from infergrid.constants import (
    ANNOTATION_TOPOLOGY,
    RESOURCE_GPU,
    RESOURCE_VGPU,
    TOPOLOGY_NVLINK,
    mig_resource,
)
from infergrid.placement.gpu_choice import choose_mig, choose_whole
from infergrid.placement.policy import Policy
from infergrid.placement.shortfall import Shortfall, busy_counts, why_not_share
from infergrid.placement.state import ALL_CORES, NodeState
from infergrid.placement.topology import largest_nvlink_set
from infergrid.pod_request import ContainerGpuRequest

Placed = ContainerAssignment | tuple[Shortfall, ...]
Placer = Callable[[ContainerGpuRequest, NodeState, str | None, Policy], Placed]


def place_whole(
    request: ContainerGpuRequest, node: NodeState, topology: str | None, policy: Policy
) -> Placed:
    """N idle GPUs, all pairs NVLinked when the pod's topology is ``nvlink``; where the node
    time-slices its GPUs, N GPUs with a time slice left and no share, chosen by the policy.

    A whole GPU (or a time slice, which sees all of it) is assigned its full memory and
    100% of its SMs.
    """
    free = [g for g in node.gpus if g.takes_whole()]
    nvlink = topology == TOPOLOGY_NVLINK and request.gpus > 1
    chosen = choose_whole(free, request.gpus, nvlink, policy.choice.packs)
    if chosen is not None:
        gpus = tuple(AssignedGpu(g.uuid, g.memory_mib, ALL_CORES) for g in chosen)
        return ContainerAssignment(request.name, gpus=gpus)
    if len(free) >= request.gpus:
        largest = largest_nvlink_set(free)
        reason = (
            f"no NVLink-connected set of {request.gpus} free GPUs "
            f"(largest has {largest} of {len(free)} free)"
        )
        return (Shortfall(None, ANNOTATION_TOPOLOGY, largest, request.gpus, reason),)
    free_as = "have a time slice free" if any(g.time_sliced for g in node.gpus) else "free"
    reason = f"{len(free)} of {len(node.gpus)} GPUs {free_as}, needs {request.gpus}"
    if busy := busy_counts(node.gpus):
        reason = f"{reason}: {busy}"
    return (Shortfall(None, RESOURCE_GPU, len(free), request.gpus, reason),)


def place_share(
    request: ContainerGpuRequest, node: NodeState, topology: str | None, policy: Policy
) -> Placed:
    """A share on one GPU that is not held whole, not in MIG mode, with room in both
    memory and SMs; among those the policy picks."""
    memory, cores = request.memory_mib, request.cores
    fits = [g for g in node.gpus if g.takes_share(memory, cores)]
    if fits:
        gpu = policy.choice.share(node, fits, memory, cores, policy.workload, policy.salt)
        assigned = (AssignedGpu(gpu.uuid, memory, cores),)
        return ContainerAssignment(request.name, gpus=assigned, shared=True)
    if not node.gpus:
        return (Shortfall(None, RESOURCE_VGPU, 0, 1, "node has no GPUs"),)
    return tuple(s for g in node.gpus for s in why_not_share(g, memory, cores))


def place_mig(
    request: ContainerGpuRequest, node: NodeState, topology: str | None, policy: Policy
) -> Placed:
    """A free instance of the asked MIG profile on an available GPU in MIG mode."""
    profile = request.mig_profile or ""
    slots = [(g, s) for g in node.gpus if g.mig_enabled for s in g.mig if s.profile == profile]
    free = [(g, s) for g, s in slots if g.available and not s.taken]
    if free:
        gpu, slot = choose_mig(free, policy.choice.packs)
        mig = AssignedMig(uuid=slot.uuid, profile=slot.profile, gpu_uuid=gpu.uuid)
        return ContainerAssignment(request.name, mig=mig)
    taken = sum(1 for g, s in slots if g.available and s.taken)
    offline = sum(1 for g, _ in slots if not g.available)
    details = [f"{taken} taken"] if taken else []
    details += [f"{offline} on unavailable GPUs"] if offline else []
    reason = f"no free MIG {profile} instance" + (f" ({', '.join(details)})" if details else "")
    return (Shortfall(None, mig_resource(profile), 0, 1, reason),)


PLACERS: Final[Mapping[str, Placer]] = MappingProxyType(
    {"whole": place_whole, "share": place_share, "mig": place_mig}
)
"""The placer for each kind of container request."""
