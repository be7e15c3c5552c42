"""The plain data placement decides over: one node's GPUs and what is held on them.

Placement reads nothing else, so the extender (from its watch cache) and the
trace simulator (from its own bookkeeping) feed the same decisions. Every value
is immutable; a changed node is a new tuple of GPUs that shares the unchanged ones.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from infergrid.assignment_annotation import PodAssignment
from infergrid.constants import DEFAULT_VGPU_SLOTS_PER_GPU, LINK_NVLINK

ALL_CORES: Final = 100
"""A GPU's SMs in the unit of ``gpu-cores``: percent."""

IDLE_USED_MIB: Final = 512
"""Measured use below this still lets a GPU be taken whole.

Drivers, persistence daemons and monitoring agents hold a few hundred MiB on a
GPU nobody uses; anything above that is a process InferGrid did not place, and
a pod that asked for a whole GPU must not find it there.
"""

_NO_LINK: Final = ("", 0)


@dataclass(frozen=True, slots=True)
class MigSlot:
    """A MIG instance of a GPU and whether an assignment holds it; a pod gets it whole."""

    uuid: str
    profile: str
    memory_mib: int
    sm_count: int
    taken: bool = False


@dataclass(frozen=True, slots=True)
class GpuState:
    """One GPU: what the inventory says it is, what is measured and what is assigned on it.

    ``measured`` says the node's usage carries a sample for this GPU; without one
    its free memory is unknown, so it offers nothing. ``assigned_cores`` counts a
    whole-GPU holder as 100. ``links`` maps a peer's index to (link type, NVLinks).
    ``holders`` counts the ``nvidia.com/gpu`` containers holding the GPU: at most one,
    or up to ``time_slices`` where the node time-slices its GPUs (each then sees all
    of it); the whole GPU's memory and SMs are assigned with the first holder and
    given back with the last, so ``assigned_mib`` never exceeds the GPU.
    """

    uuid: str
    index: int
    model: str
    memory_mib: int
    sm_count: int
    numa_node: int
    healthy: bool
    measured: bool
    links: Mapping[int, tuple[str, int]]
    used_mib: int = 0
    assigned_mib: int = 0
    assigned_cores: int = 0
    shares: int = 0
    share_slots: int = DEFAULT_VGPU_SLOTS_PER_GPU
    holders: int = 0
    time_slices: int = 1
    mig_enabled: bool = False
    mig: tuple[MigSlot, ...] = ()
    compute_capability: str = ""

    @property
    def label(self) -> str:
        """How people name the GPU in reasons: its uuid, and the index nvidia-smi shows."""
        return f"{self.uuid} (index {self.index})"

    @property
    def available(self) -> bool:
        """Healthy, measured and with memory: the conditions to offer anything at all."""
        return self.healthy and self.measured and self.memory_mib > 0

    @property
    def free_mib(self) -> int:
        """Total less the larger of assigned and measured, so foreign use still counts."""
        return max(0, self.memory_mib - max(self.assigned_mib, self.used_mib))

    @property
    def free_cores(self) -> int:
        """Percent of SMs not yet promised to a share or a whole-GPU holder."""
        return max(0, ALL_CORES - self.assigned_cores)

    @property
    def idle(self) -> bool:
        """Nothing assigned, nothing measured beyond ``IDLE_USED_MIB``, not carved into MIG."""
        return (
            not self.mig_enabled
            and not self.held_whole
            and self.shares == 0
            and self.assigned_mib == 0
            and self.assigned_cores == 0
            and self.used_mib < IDLE_USED_MIB
        )

    @property
    def held_mib(self) -> int:
        """Memory in use by anyone: taken MIG instances in MIG mode, else total less free."""
        if self.mig_enabled:
            return min(self.memory_mib, sum(s.memory_mib for s in self.mig if s.taken))
        return self.memory_mib - self.free_mib

    @property
    def busy(self) -> bool:
        """Whether anything at all holds part of the GPU."""
        return self.held_mib > 0 or self.shares > 0 or self.held_whole

    @property
    def held_whole(self) -> bool:
        """Held by ``nvidia.com/gpu`` pods, alone or in time slices: it then takes no share."""
        return self.holders > 0

    @property
    def time_sliced(self) -> bool:
        """Whether ``nvidia.com/gpu`` pods share this GPU by time (``time_slices`` above 1)."""
        return self.time_slices > 1

    @property
    def held_as(self) -> str:
        """How the GPU is held whole, for reasons: by one pod, or by some of its time slices."""
        if not self.time_sliced:
            return "held whole by another pod"
        return f"time-sliced: {self.holders} of {self.time_slices} time slices taken"

    def takes_whole(self) -> bool:
        """Whether a pod asking for whole GPUs may take this one right now.

        Exclusively (``time_slices`` 1) the GPU must be idle. As a time slice it needs
        a slice left and no share; measured use does not count, since time slices
        share the GPU by time and their holders' own use is what is measured.
        """
        if not self.time_sliced:
            return self.available and self.idle
        return (
            self.available
            and not self.mig_enabled
            and self.shares == 0
            and self.holders < self.time_slices
        )

    def takes_share(self, memory_mib: int, cores: int) -> bool:
        """Whether a share of ``memory_mib`` and ``cores`` percent fits on this GPU right now."""
        return (
            self.available
            and not self.mig_enabled
            and not self.held_whole
            and self.shares < self.share_slots
            and self.free_mib >= memory_mib
            and self.free_cores >= cores
        )

    def nvlinks(self, peer_index: int) -> int:
        """NVLinks to the GPU at ``peer_index``; 0 when they are joined some other way."""
        kind, count = self.links.get(peer_index, _NO_LINK)
        return count if kind == LINK_NVLINK else 0


@dataclass(frozen=True, slots=True)
class AssignmentIssue:
    """Part of a recorded assignment that does not match the node; the caller logs it.

    Such parts are left out of the capacity count when they name nothing on the
    node, and counted (conservatively) when they only clash with another holder.
    """

    assignment: PodAssignment
    container: str
    reason: str


@dataclass(frozen=True, slots=True)
class HostResources:
    """A node's CPU and memory: capacity, and what placed pods request of it.

    kube-scheduler keeps this account in a cluster (NodeResourcesFit), so the
    extender leaves it out; the trace simulator has no kube-scheduler and puts
    it here, so that fit, the scorers and fragmentation can see CPU.
    """

    cpu_milli: int
    memory_mib: int
    requested_cpu_milli: int = 0
    requested_memory_mib: int = 0

    @property
    def free_cpu_milli(self) -> int:
        """Millicores no placed pod requests."""
        return self.cpu_milli - self.requested_cpu_milli

    @property
    def free_memory_mib(self) -> int:
        """MiB of memory no placed pod requests."""
        return self.memory_mib - self.requested_memory_mib


@dataclass(frozen=True, slots=True)
class NodeState:
    """One node's GPUs in index order, and whether its heartbeat is fresh enough to offer them.

    ``issues`` are what building the state found wrong in recorded assignments;
    they do not take part in equality, so a rebuilt state equals a live one.
    ``host`` is the node's CPU and memory where the caller tracks them (the
    simulator); None where kube-scheduler does (the extender).
    """

    name: str
    gpus: tuple[GpuState, ...]
    offers: bool
    heartbeat: datetime | None = None
    issues: tuple[AssignmentIssue, ...] = field(default=(), compare=False)
    host: HostResources | None = None

    @property
    def product(self) -> str:
        """The GPU model the node is labelled with: its lowest-index GPU's; "" without GPUs."""
        return self.gpus[0].model if self.gpus else ""
