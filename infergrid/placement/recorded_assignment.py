"""Between a placement and the ``infergrid.io/gpu-assignment`` annotation, both ways.

A placement is a tuple of the contract's ``ContainerAssignment``s, so the
annotation written at bind is the placement itself plus node and time; reading
an annotation back gives what to reserve, minus what the node does not have.
"""

from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime

from infergrid.assignment_annotation import ContainerAssignment, PodAssignment
from infergrid.placement.state import AssignmentIssue, NodeState


def to_pod_assignment(
    node_name: str, placements: Iterable[ContainerAssignment], now: datetime
) -> PodAssignment:
    """The assignment to write at bind, decided at ``now`` (timezone-aware)."""
    return PodAssignment(node=node_name, assigned_at=now, containers=tuple(placements))


def reservation_from_assignment(
    assignment: PodAssignment, node: NodeState
) -> tuple[tuple[ContainerAssignment, ...], tuple[AssignmentIssue, ...]]:
    """What a recorded assignment holds on ``node``, and the parts that name nothing there.

    A GPU or MIG instance the node does not list is left out and reported: it
    cannot take capacity from anything the node offers. A MIG instance is found
    by its own uuid, so a wrong ``gpuUuid`` is corrected from the inventory.
    """
    if assignment.node != node.name:
        issue = AssignmentIssue(assignment, "", f"assigned to node {assignment.node!r}")
        return (), (issue,)
    known = {g.uuid for g in node.gpus}
    parents = {s.uuid: g.uuid for g in node.gpus for s in g.mig} if _has_mig(assignment) else {}
    kept: list[ContainerAssignment] = []
    issues: list[AssignmentIssue] = []
    for container in assignment.containers:
        mig = container.mig
        if mig is not None:
            parent = parents.get(mig.uuid)
            if parent is None:
                issues.append(AssignmentIssue(assignment, container.name, f"no MIG {mig.uuid}"))
                continue
            if parent != mig.gpu_uuid:
                container = replace(container, mig=replace(mig, gpu_uuid=parent))
            kept.append(container)
            continue
        gpus = tuple(g for g in container.gpus if g.uuid in known)
        issues += (
            AssignmentIssue(assignment, container.name, f"no GPU {g.uuid} on node {node.name}")
            for g in container.gpus
            if g.uuid not in known
        )
        if gpus:
            kept.append(
                container if len(gpus) == len(container.gpus) else replace(container, gpus=gpus)
            )
    return tuple(kept), tuple(issues)


def _has_mig(assignment: PodAssignment) -> bool:
    return any(c.mig is not None for c in assignment.containers)
