"""Whether a pod fits a node, and on which GPUs: the pure check behind filter and bind.

Containers are placed one after another on a working copy of the node, so two
containers of one pod never get the same capacity. Init containers are placed
like the others and keep their GPUs for the pod's life. Kubernetes would let an
app container reuse them (init containers finish first), but the assignment
records each container's GPUs and the device plugin counts every record when it
re-checks over-commit, so both would have to learn the exception. The price is
capacity, and only for the rare pod whose init container asks for a GPU.
"""

from dataclasses import dataclass, replace

from infergrid.assignment_annotation import ContainerAssignment
from infergrid.constants import ANNOTATION_GPU_MODELS, ANNOTATION_GPU_USAGE
from infergrid.gpu_models import GpuConstraint
from infergrid.placement.host import HostRequest, host_shortfalls, reserve_host
from infergrid.placement.placers import PLACERS
from infergrid.placement.policy import Policy
from infergrid.placement.reserve import apply
from infergrid.placement.shortfall import Shortfall
from infergrid.placement.state import NodeState
from infergrid.pod_request import PodGpuRequest


@dataclass(frozen=True, slots=True)
class FitResult:
    """The placement of every GPU container, or every shortfall; never both.

    ``after`` is the node with the placement reserved: bind stores it, and the
    scorers compare it with the node before. It is worked out only when asked
    for, since filter, which asks about thousands of nodes, never needs it.
    ``host`` is the pod's CPU and memory, reserved in ``after`` too (see ``fit``).
    """

    placements: tuple[ContainerAssignment, ...] = ()
    shortfalls: tuple[Shortfall, ...] = ()
    before: NodeState | None = None
    host: HostRequest | None = None

    @property
    def after(self) -> NodeState | None:
        """The node with the placement reserved; None when the pod does not fit."""
        if self.before is None or self.shortfalls:
            return None
        node = apply(self.before, self.placements) if self.placements else self.before
        return reserve_host(node, self.host)

    @property
    def fits(self) -> bool:
        """Whether the pod fits the node."""
        return not self.shortfalls

    @property
    def reasons(self) -> tuple[str, ...]:
        """Every shortfall as a line for people; the extender's filter reason."""
        return tuple(s.message for s in self.shortfalls)


def fit(
    request: PodGpuRequest, node: NodeState, policy: Policy, host: HostRequest | None = None
) -> FitResult:
    """Place each GPU container of ``request`` on ``node``, choosing GPUs by ``policy``.

    ``request.policy`` is not read: the caller resolved it into ``policy`` once.
    A pod without GPU containers fits any node, stale or not: it needs nothing
    the heartbeat vouches for. A container that does not fit is left out of the
    working copy and the next ones are still tried, so every shortfall shows.
    ``host`` (the simulator's; the extender passes none) adds the pod's CPU,
    memory and GPU models: checked before the GPUs, and reserved in ``after``.
    """
    containers = request.gpu_containers
    outside = host_shortfalls(node, host, wants_gpus=bool(containers))
    if not containers:
        return FitResult(shortfalls=outside) if outside else FitResult(before=node, host=host)
    if not node.offers:
        return FitResult(shortfalls=(*outside, _stale(node)))
    working, refused = suitable(node, request.gpu_constraint)
    if refused and not working.gpus:
        return FitResult(shortfalls=(*outside, *refused))
    placements: list[ContainerAssignment] = []
    shortfalls: list[Shortfall] = []
    last = len(containers) - 1
    for i, container in enumerate(containers):
        placed = PLACERS[container.kind](container, working, request.topology, policy)
        if isinstance(placed, ContainerAssignment):
            placements.append(placed)
            if i < last:
                working = apply(working, (placed,))
        else:
            shortfalls += (_named(s, container.name) for s in placed)
    if shortfalls or outside:
        return FitResult(shortfalls=(*outside, *shortfalls, *refused))
    return FitResult(placements=tuple(placements), before=node, host=host)


def suitable(node: NodeState, constraint: GpuConstraint) -> tuple[NodeState, tuple[Shortfall, ...]]:
    """The node with only the GPUs whose model the pod accepts, and why each other GPU is not.

    Placement then works on the GPUs kept; the result is still reserved on the whole node.
    """
    if constraint.empty:
        return node, ()
    kept, refused = [], []
    for gpu in node.gpus:
        why = constraint.why_not(gpu.model, gpu.memory_mib, gpu.compute_capability)
        if why is None:
            kept.append(gpu)
        else:
            refused.append(Shortfall(gpu.uuid, ANNOTATION_GPU_MODELS, 0, 1, f"{gpu.label}: {why}"))
    return replace(node, gpus=tuple(kept)), tuple(refused)


def surely_unfit(request: PodGpuRequest, node: NodeState, host: HostRequest | None) -> bool:
    """True when ``fit`` would certainly find no room, tested container by container with
    the placers' own predicates: a scorer, which needs no reasons, skips building them.
    False says nothing (containers together, or NVLink, may still not fit)."""
    containers = request.gpu_containers
    if host is not None and host_shortfalls(node, host, wants_gpus=bool(containers)):
        return True
    if containers and not node.offers:
        return True
    node, _ = suitable(node, request.gpu_constraint)
    for container in containers:
        if container.kind == "whole":
            if sum(1 for g in node.gpus if g.takes_whole()) < container.gpus:
                return True
        elif container.kind == "share":
            memory, cores = container.memory_mib, container.cores
            if not any(g.takes_share(memory, cores) for g in node.gpus):
                return True
    return False


def _stale(node: NodeState) -> Shortfall:
    if node.heartbeat is None:
        reason = "node heartbeat is stale: no GPU usage published"
    else:
        reason = f"node heartbeat is stale: last at {node.heartbeat.isoformat()}"
    return Shortfall(None, ANNOTATION_GPU_USAGE, 0, 0, reason)


def _named(shortfall: Shortfall, container: str) -> Shortfall:
    return replace(shortfall, container=container)
