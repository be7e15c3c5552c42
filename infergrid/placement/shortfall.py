"""Why a node cannot take a container: one structured record per reason, with its numbers.

People debug rejections from these messages, so every GPU that could have served a
share says why it did not, like kube-scheduler's InsufficientResource list. A whole-GPU
request's line counts the busy GPUs by cause instead (``busy_counts``): kube-scheduler sums
a pod's rejections by equal reason across nodes, and per-GPU lines made each node's
reason unique, filling the FailedScheduling message (cut at 1 KiB) with one node's GPUs
and the filter answer with 2.5 MB at 5,000 nodes.
``resource`` is the contract name that falls short (``infergrid.io/gpu-memory``,
``nvidia.com/gpu``, ...); ``free`` and ``needed`` are in that resource's unit.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from infergrid.constants import (
    RESOURCE_GPU,
    RESOURCE_GPU_CORES,
    RESOURCE_GPU_MEMORY,
    RESOURCE_VGPU,
)
from infergrid.placement.state import IDLE_USED_MIB, GpuState


@dataclass(frozen=True, slots=True)
class Shortfall:
    """One reason a request does not fit; ``gpu`` is None for reasons about the whole node."""

    gpu: str | None
    resource: str
    free: int
    needed: int
    reason: str
    container: str = ""

    @property
    def message(self) -> str:
        """The reason, naming the container when there is one."""
        return f"container {self.container!r}: {self.reason}" if self.container else self.reason


def why_unavailable(gpu: GpuState) -> str | None:
    """Why the GPU offers nothing at all, or None when it is available."""
    if not gpu.healthy:
        return f"{gpu.label}: unhealthy"
    if not gpu.measured:
        return f"{gpu.label}: no usage sample in the node's heartbeat"
    if gpu.memory_mib <= 0:
        return f"{gpu.label}: reports no memory"
    return None


def why_not_whole(gpu: GpuState) -> Shortfall | None:
    """Why the GPU cannot be taken whole, or None when it can."""
    reason = why_unavailable(gpu)
    if reason is None:
        reason = _why_busy(gpu)
    return None if reason is None else Shortfall(gpu.uuid, RESOURCE_GPU, 0, 1, reason)


BUSY_CAUSES: Final = (
    "unavailable",
    "in MIG mode",
    "held whole by another pod",
    "with every time slice taken",
    "holding shares",
    "in use outside assignments",
)
"""Why a GPU is not free to take whole, in the order a count line names them."""


def busy_cause(gpu: GpuState) -> int | None:
    """The index into ``BUSY_CAUSES`` of why the GPU cannot be taken whole (``why_not_whole``'s
    conditions, without the numbers), or None when it can."""
    if not gpu.available:
        return 0
    if gpu.mig_enabled:
        return 1
    if gpu.holders >= gpu.time_slices:
        return 3 if gpu.time_sliced else 2
    if gpu.shares:
        return 4
    if not gpu.time_sliced and gpu.used_mib >= IDLE_USED_MIB:
        return 5
    return None


def busy_counts(gpus: Iterable[GpuState]) -> str:
    """The GPUs not free to take whole, counted by cause: "2 held whole by another pod, 1
    holding shares". kube-scheduler sums a pod's rejections by equal reason and cuts the
    message at 1 KiB, so a count line must read the same on every node in the same state:
    the GPUs' uuids and numbers are for ``infergrid placements``, not for this line."""
    counts = [0] * len(BUSY_CAUSES)
    for gpu in gpus:
        cause = busy_cause(gpu)
        if cause is not None:
            counts[cause] += 1
    return ", ".join(f"{n} {why}" for n, why in zip(counts, BUSY_CAUSES, strict=True) if n)


def _why_busy(gpu: GpuState) -> str | None:
    """``takes_whole``'s conditions, each as a reason; measured use does not stop a time slice."""
    if gpu.mig_enabled:
        return f"{gpu.label}: in MIG mode, offers only MIG instances"
    if gpu.holders >= gpu.time_slices:
        return f"{gpu.label}: {gpu.held_as}"
    if gpu.shares:
        return f"{gpu.label}: holds {gpu.shares} share(s)"
    if not gpu.time_sliced and gpu.used_mib >= IDLE_USED_MIB:
        return f"{gpu.label}: {gpu.used_mib} MiB in use, idle is under {IDLE_USED_MIB}"
    return None


def why_not_share(gpu: GpuState, memory_mib: int, cores: int) -> list[Shortfall]:
    """Every reason the GPU cannot take a share of ``memory_mib`` and ``cores`` percent."""
    reason = why_unavailable(gpu)
    if reason is None and gpu.mig_enabled:
        reason = f"{gpu.label}: in MIG mode, offers only MIG instances"
    if reason is None and gpu.held_whole:
        reason = f"{gpu.label}: {gpu.held_as}"
    if reason is not None:
        return [Shortfall(gpu.uuid, RESOURCE_VGPU, 0, 1, reason)]
    found = []
    if gpu.shares >= gpu.share_slots:
        reason = f"{gpu.label}: all {gpu.share_slots} share slots taken"
        found.append(Shortfall(gpu.uuid, RESOURCE_VGPU, 0, 1, reason))
    if gpu.free_mib < memory_mib:
        found.append(
            Shortfall(
                gpu.uuid, RESOURCE_GPU_MEMORY, gpu.free_mib, memory_mib, _memory(gpu, memory_mib)
            )
        )
    if gpu.free_cores < cores:
        reason = f"{gpu.label}: {gpu.free_cores}% of SMs free, needs {cores}%"
        found.append(Shortfall(gpu.uuid, RESOURCE_GPU_CORES, gpu.free_cores, cores, reason))
    return found


def _memory(gpu: GpuState, needed: int) -> str:
    """The memory reason; says so when measured use, not assignments, is what fills the GPU."""
    text = f"{gpu.label}: {gpu.free_mib} MiB free, needs {needed}"
    if gpu.used_mib > gpu.assigned_mib:
        text += f" ({gpu.used_mib} MiB measured in use, {gpu.assigned_mib} assigned)"
    return text
