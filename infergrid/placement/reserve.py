"""Reserving a pod's GPUs on a node state, and giving them back.

The extender reserves at bind and releases when a pod goes; the simulator places
pod after pod. Both need the new state cheaply, so only the touched GPUs are
rebuilt. The records are the contract's own ``ContainerAssignment``s, so what is
reserved is exactly what the annotation says. Capacity is not re-checked here
(``fit`` does that); structural misuse is: a GPU the node lacks, a MIG instance
taken twice, a GPU both shared and held whole, more holders of a GPU than its time
slices. That is a caller's bug and raises.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from infergrid.assignment_annotation import AssignedGpu, AssignedMig, ContainerAssignment
from infergrid.errors import ContractError
from infergrid.placement.state import GpuState, NodeState

Report = Callable[[str, str], None]
"""Receives (container name, reason) for each clash found while changing a node."""

_Result = tuple[GpuState, str | None]


@dataclass(frozen=True, slots=True)
class _Direction:
    """How one GPU changes when a container's share, whole GPU or MIG instance comes or goes."""

    gpu: Callable[[GpuState, AssignedGpu, bool], _Result]
    mig: Callable[[GpuState, AssignedMig], _Result]


def apply(node: NodeState, containers: Iterable[ContainerAssignment]) -> NodeState:
    """``node`` with the containers' GPUs reserved; ContractError on a structural clash."""
    return _change(node, containers, _RESERVE, _raise)


def release(node: NodeState, containers: Iterable[ContainerAssignment]) -> NodeState:
    """``node`` with the containers' GPUs given back; ContractError if they were not held.

    After an error the caller should rebuild the node from its annotations: that
    is the one source of truth, and rebuilding loses nothing.
    """
    return _change(node, containers, _RELEASE, _raise)


def apply_reporting(
    node: NodeState, containers: Iterable[ContainerAssignment], report: Report
) -> NodeState:
    """Like ``apply``, but each clash is reported and the holder still counted.

    Recorded assignments describe pods that may really be running, so when two
    of them clash the safe answer is to count both and offer less.
    """
    return _change(node, containers, _RESERVE, report)


def reserved_share(gpu: GpuState, memory_mib: int, cores: int) -> GpuState:
    """``gpu`` as it would be with one more share: for weighing candidates before choosing."""
    return _reserve_gpu(gpu, AssignedGpu(gpu.uuid, memory_mib, cores), True)[0]


def _raise(container: str, reason: str) -> None:
    raise ContractError("placement", f"container {container!r}: {reason}")


def _change(
    node: NodeState, containers: Iterable[ContainerAssignment], way: _Direction, report: Report
) -> NodeState:
    gpus = list(node.gpus)
    positions = {g.uuid: i for i, g in enumerate(gpus)}
    for container in containers:
        steps = _steps(container, way)
        for uuid, step in steps:
            at = positions.get(uuid)
            if at is None:
                report(container.name, f"no GPU {uuid} on node {node.name}")
                continue
            gpus[at], problem = step(gpus[at])
            if problem is not None:
                report(container.name, problem)
    return replace(node, gpus=tuple(gpus))


def _steps(
    container: ContainerAssignment, way: _Direction
) -> list[tuple[str, Callable[[GpuState], _Result]]]:
    """One change per GPU the container touches, keyed by that GPU's uuid."""
    mig = container.mig
    if mig is not None:
        return [(mig.gpu_uuid, lambda g: way.mig(g, mig))]
    shared = container.shared
    return [(a.uuid, lambda g, a=a: way.gpu(g, a, shared)) for a in container.gpus]


def _reserve_gpu(gpu: GpuState, assigned: AssignedGpu, shared: bool) -> _Result:
    """One more share or whole-GPU holder; a time slice beside others assigns nothing more."""
    problem = None
    if gpu.mig_enabled:
        problem = f"{gpu.label} is in MIG mode and offers only MIG instances"
    elif (shared and gpu.held_whole) or gpu.holders >= gpu.time_slices:
        problem = f"{gpu.label} is {_held(gpu)}"
    elif not shared and gpu.shares:
        problem = f"{gpu.label} holds {gpu.shares} shares and cannot be held whole"
    counted = shared or not gpu.held_whole
    changed = replace(
        gpu,
        assigned_mib=gpu.assigned_mib + assigned.memory_mib * counted,
        assigned_cores=gpu.assigned_cores + assigned.cores * counted,
        shares=gpu.shares + shared,
        holders=gpu.holders + (not shared),
    )
    return changed, problem


def _release_gpu(gpu: GpuState, assigned: AssignedGpu, shared: bool) -> _Result:
    """One share or whole-GPU holder fewer; the last holder of a GPU gives back all of it."""
    problem = None
    counted = shared or gpu.holders == 1
    if shared and gpu.shares == 0:
        problem = f"{gpu.label} holds no share to give back"
    elif not shared and not gpu.held_whole:
        problem = f"{gpu.label} is not held whole"
    elif counted and (
        gpu.assigned_mib < assigned.memory_mib or gpu.assigned_cores < assigned.cores
    ):
        problem = f"{gpu.label} has less assigned than is given back"
    changed = replace(
        gpu,
        assigned_mib=max(0, gpu.assigned_mib - assigned.memory_mib * counted),
        assigned_cores=max(0, gpu.assigned_cores - assigned.cores * counted),
        shares=max(0, gpu.shares - shared),
        holders=max(0, gpu.holders - (not shared)),
    )
    return changed, problem


def _held(gpu: GpuState) -> str:
    """How a GPU held whole is held, for a clash's reason: alone, or in time slices."""
    return gpu.held_as if gpu.time_sliced else "already held whole"


def _set_mig(gpu: GpuState, mig: AssignedMig, taken: bool) -> _Result:
    """The GPU with one MIG instance marked ``taken``, or why that instance cannot change."""
    for at, slot in enumerate(gpu.mig):
        if slot.uuid != mig.uuid:
            continue
        if slot.taken == taken:
            state = "already taken" if taken else "not taken"
            return gpu, f"MIG instance {mig.uuid} on {gpu.label} is {state}"
        slots = (*gpu.mig[:at], replace(slot, taken=taken), *gpu.mig[at + 1 :])
        return replace(gpu, mig=slots), None
    return gpu, f"no MIG instance {mig.uuid} on {gpu.label}"


_RESERVE = _Direction(gpu=_reserve_gpu, mig=lambda g, m: _set_mig(g, m, True))
_RELEASE = _Direction(gpu=_release_gpu, mig=lambda g, m: _set_mig(g, m, False))
