"""A node's state from its annotations: inventory, usage, and the assignments of its pods.

The extender rebuilds every node from these alone after a restart, so this is
the one place that turns recorded facts into capacity; ``apply`` and ``release``
then keep a live state in step with it. It reads no clock: callers pass ``now``.
"""

from collections.abc import Iterable
from datetime import datetime, timedelta
from types import MappingProxyType

from infergrid.assignment_annotation import PodAssignment
from infergrid.errors import ContractError
from infergrid.inventory import Gpu, GpuInventory
from infergrid.placement.recorded_assignment import reservation_from_assignment
from infergrid.placement.reserve import Report, apply_reporting
from infergrid.placement.state import AssignmentIssue, GpuState, MigSlot, NodeState
from infergrid.usage import GpuUsage, GpuUsageSample


def build_node_state(
    inventory: GpuInventory,
    usage: GpuUsage | None,
    assignments: Iterable[PodAssignment],
    now: datetime,
    stale_after: timedelta,
) -> NodeState:
    """The node with every recorded assignment reserved; what did not fit is in ``issues``.

    The node offers nothing when usage is missing or its heartbeat is older than
    ``stale_after``: a device plugin that went quiet may have lost its GPUs. A
    heartbeat ahead of ``now`` counts as fresh (clocks of two machines differ).
    """
    if now.tzinfo is None:
        raise ContractError("now", "time must be timezone-aware")
    heartbeat = usage.heartbeat if usage is not None else None
    offers = heartbeat is not None and now - heartbeat <= stale_after
    used = {s.uuid: s.used_mib for s in usage.gpus} if usage is not None else {}
    gpus = tuple(
        _gpu_state(g, used, inventory) for g in sorted(inventory.gpus, key=lambda g: g.index)
    )
    node = NodeState(inventory.node, gpus, offers, heartbeat)
    issues: list[AssignmentIssue] = []
    for assignment in assignments:
        containers, found = reservation_from_assignment(assignment, node)
        issues += found
        node = apply_reporting(node, containers, _collect(issues, assignment))
    return NodeState(node.name, node.gpus, offers, heartbeat, tuple(issues))


def _collect(issues: list[AssignmentIssue], assignment: PodAssignment) -> Report:
    """A report callback that records clashes of ``assignment`` in ``issues``."""

    def report(container: str, reason: str) -> None:
        issues.append(AssignmentIssue(assignment, container, reason))

    return report


def _gpu_state(gpu: Gpu, used: dict[str, int], inventory: GpuInventory) -> GpuState:
    return GpuState(
        uuid=gpu.uuid,
        index=gpu.index,
        model=gpu.model,
        memory_mib=gpu.memory_mib,
        sm_count=gpu.sm_count,
        numa_node=gpu.numa_node,
        healthy=gpu.healthy,
        measured=gpu.uuid in used,
        compute_capability=gpu.compute_capability,
        links=MappingProxyType({k.peer_index: (k.type, k.count) for k in gpu.links}),
        used_mib=used.get(gpu.uuid, 0),
        share_slots=inventory.share_slots,
        time_slices=inventory.time_slices,
        mig_enabled=gpu.mig_enabled,
        mig=tuple(MigSlot(m.uuid, m.profile, m.memory_mib, m.sm_count) for m in gpu.mig_instances),
    )


def idle_usage(inventory: GpuInventory, now: datetime) -> GpuUsage:
    """Usage of a node whose GPUs nobody touches, heartbeat ``now``: the simulator's input."""
    samples = tuple(GpuUsageSample(g.uuid, 0, 0) for g in inventory.gpus)
    return GpuUsage(node=inventory.node, heartbeat=now, gpus=samples)
