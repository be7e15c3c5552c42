"""Whether a node can still hold a placement that was already decided, and if not, why.

The device plugin re-checks each assignment at Allocate before it hands GPUs to
a container, so that no annotation can over-commit a GPU. It asks here, with the
same rules and messages ``fit`` uses to decide, so the scheduler and the kubelet's
gatekeeper can never disagree about what fits.
"""

from dataclasses import replace

from infergrid.assignment_annotation import AssignedMig, ContainerAssignment
from infergrid.constants import RESOURCE_GPU, mig_resource
from infergrid.placement.shortfall import (
    Shortfall,
    why_not_share,
    why_not_whole,
    why_unavailable,
)
from infergrid.placement.state import NodeState


def recheck(node: NodeState, container: ContainerAssignment) -> tuple[Shortfall, ...]:
    """Every reason ``node`` cannot take ``container`` as assigned; empty when it can."""
    if container.mig is not None:
        found = _mig_shortfalls(node, container.mig)
    else:
        found = _gpu_shortfalls(node, container)
    return tuple(replace(s, container=container.name) for s in found)


def _gpu_shortfalls(node: NodeState, container: ContainerAssignment) -> list[Shortfall]:
    """A share must fit ``why_not_share``, each whole GPU ``why_not_whole``: fit's own tests."""
    gpus = {g.uuid: g for g in node.gpus}
    found: list[Shortfall] = []
    for assigned in container.gpus:
        gpu = gpus.get(assigned.uuid)
        if gpu is None:
            found.append(_missing(node, assigned.uuid, RESOURCE_GPU))
        elif container.shared:
            found += why_not_share(gpu, assigned.memory_mib, assigned.cores)
        elif (whole := why_not_whole(gpu)) is not None:
            found.append(whole)
    return found


def _mig_shortfalls(node: NodeState, mig: AssignedMig) -> list[Shortfall]:
    """The instance is found by its own uuid, as when an assignment is rebuilt into a node."""
    resource = mig_resource(mig.profile)
    for gpu in node.gpus:
        for slot in gpu.mig:
            if slot.uuid != mig.uuid:
                continue
            reason = why_unavailable(gpu)
            if reason is None and slot.taken:
                reason = f"{gpu.label}: MIG instance {mig.uuid} is already taken"
            return [] if reason is None else [Shortfall(gpu.uuid, resource, 0, 1, reason)]
    return [_missing(node, mig.uuid, resource)]


def _missing(node: NodeState, uuid: str, resource: str) -> Shortfall:
    return Shortfall(uuid, resource, 0, 1, f"no GPU or MIG instance {uuid} on node {node.name}")
