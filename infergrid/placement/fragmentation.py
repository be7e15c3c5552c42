"""GPU fragmentation as the FGD paper measures it (Weng et al., USENIX ATC '23).

Definitions, in this module's units (1.0 is one whole GPU):

* A workload is a set of task types m, each with a popularity p_m (Σ p_m = 1)
  and a GPU demand: either k whole GPUs, or a share of one GPU given as memory
  (MiB) and SMs (percent).
* free(g), the unallocated capacity of GPU g, is the mean of its free-memory
  fraction and its free-SM fraction. The paper has one dimension (milli-GPU);
  where memory and SM fractions are equal this is exactly it. A GPU that offers
  nothing (unhealthy, unmeasured, in MIG mode, stale node) has free(g) = 0.
* m can use GPU g when g takes m right now: for a share, both its memory and
  SMs fit (``GpuState.takes_share``); for whole GPUs, g is idle.
* F_n(m), the fragmentation of node n for task m: if fewer than k GPUs of n
  can be used by m (k = 1 for a share), m cannot run there at all and all of n's
  free capacity, Σ_g free(g), is fragment to it. Otherwise only the leftovers m
  cannot use are: Σ free(g) over the GPUs g that m cannot use.
* Node fragmentation F_n = Σ_m p_m · F_n(m). The FGD score of a placement is
  the increase F_n(after) − F_n(before); lower is better.

Containers are the tasks (a pod's GPU containers each count once); MIG
requests take no part, since MIG GPUs are carved up ahead of time.
"""

import math
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from infergrid.errors import ContractError
from infergrid.placement.state import ALL_CORES, GpuState, NodeState
from infergrid.pod_request import ContainerGpuRequest, PodGpuRequest

WORKLOAD_WINDOW: Final = 1000
"""Pods, most recent last, that ``Workload.from_requests`` looks at: recent enough to follow
what people deploy now, long enough that one burst does not decide."""

TYPICAL_COVERAGE: Final = 0.95
"""Like the paper, keep the most frequent task types that together cover 95% of tasks."""

MAX_TASK_TYPES: Final = 16
"""At most this many task types, so scoring a node stays a few hundred comparisons."""

_POPULARITY_SLACK: Final = 1e-6


@dataclass(frozen=True, slots=True)
class Demand:
    """A task type's GPU demand: ``whole_gpus`` GPUs, or a share (``memory_mib``, ``cores``)."""

    whole_gpus: int = 0
    memory_mib: int = 0
    cores: int = 0

    def __post_init__(self) -> None:
        if self.whole_gpus < 0 or self.memory_mib < 0 or self.cores < 0:
            raise ContractError("demand", f"amounts must not be negative: {self}")
        if (self.whole_gpus > 0) == (self.memory_mib > 0 or self.cores > 0):
            raise ContractError("demand", f"whole GPUs or a share, not both or neither: {self}")
        if self.whole_gpus == 0 and not (self.memory_mib > 0 and 0 <= self.cores <= ALL_CORES):
            raise ContractError("demand", f"a share needs memory, and cores from 0 to 100: {self}")

    @property
    def gpus_needed(self) -> int:
        """How many usable GPUs the task needs on one node."""
        return self.whole_gpus or 1

    def usable_on(self, gpu: GpuState) -> bool:
        """Whether this task could be placed on ``gpu`` as it is now."""
        if self.whole_gpus:
            return gpu.takes_whole()
        return gpu.takes_share(self.memory_mib, self.cores)

    @staticmethod
    def of(container: ContainerGpuRequest) -> "Demand | None":
        """The demand of one container's request; None for MIG or no GPU."""
        if container.kind == "whole":
            return Demand(whole_gpus=container.gpus)
        if container.kind == "share":
            return Demand(memory_mib=container.memory_mib, cores=container.cores)
        return None


@dataclass(frozen=True, slots=True)
class Workload:
    """Task types and their popularity, which sum to 1."""

    tasks: tuple[tuple[Demand, float], ...]

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ContractError("workload", "needs at least one task type")
        if any(not (math.isfinite(p) and p > 0) for _, p in self.tasks):
            raise ContractError("workload", "every popularity must be a positive number")
        if abs(sum(p for _, p in self.tasks) - 1.0) > _POPULARITY_SLACK:
            raise ContractError("workload", "popularities must sum to 1")

    @staticmethod
    def of(weights: Iterable[tuple[Demand, float]]) -> "Workload":
        """A workload from any positive weights, scaled to sum to 1."""
        pairs = tuple(weights)
        total = sum(w for _, w in pairs)
        if not (math.isfinite(total) and total > 0):
            raise ContractError("workload", "weights must be positive numbers")
        return Workload(tuple((d, w / total) for d, w in pairs))

    @staticmethod
    def from_requests(
        requests: Iterable[PodGpuRequest],
        window: int = WORKLOAD_WINDOW,
        coverage: float = TYPICAL_COVERAGE,
        max_types: int = MAX_TASK_TYPES,
    ) -> "Workload":
        """The typical task types of the last ``window`` pods; ``DEFAULT_WORKLOAD`` if none.

        Types are kept most frequent first until they cover ``coverage`` of the
        tasks or number ``max_types``; ties go to the smaller demand, so the
        result does not depend on arrival order within the window.
        """
        counts = Counter(
            demand
            for pod in deque(requests, maxlen=max(window, 0))
            for container in pod.gpu_containers
            if (demand := Demand.of(container)) is not None
        )
        if not counts:
            return DEFAULT_WORKLOAD
        total = sum(counts.values())
        ranked = sorted(counts.items(), key=lambda dc: (-dc[1], _size(dc[0])))
        kept: list[tuple[Demand, float]] = []
        covered = 0
        for demand, count in ranked[: max(max_types, 1)]:
            kept.append((demand, float(count)))
            covered += count
            if covered >= coverage * total:
                break
        return Workload.of(kept)


DEFAULT_WORKLOAD: Final = Workload(((Demand(whole_gpus=1), 1.0),))
"""Before any request is seen: one whole GPU, the commonest inference ask. It makes FGD
keep idle GPUs idle, and pack shares onto GPUs already in use."""


def _size(demand: Demand) -> tuple[int, int, int]:
    return (demand.whole_gpus, demand.memory_mib, demand.cores)


def free_capacity(gpu: GpuState) -> float:
    """free(g): the mean of the free memory and free SM fractions; 0 if it offers nothing."""
    if not gpu.available or gpu.mig_enabled:
        return 0.0
    return (gpu.free_mib / gpu.memory_mib + gpu.free_cores / ALL_CORES) / 2


def task_fragmentation(node: NodeState, demand: Demand) -> float:
    """F_n(m) for one task type."""
    if not node.offers:
        return 0.0
    idle = slivers = 0.0
    usable = 0
    for gpu in node.gpus:
        free = free_capacity(gpu)
        idle += free
        if demand.usable_on(gpu):
            usable += 1
        else:
            slivers += free
    return idle if usable < demand.gpus_needed else slivers


def node_fragmentation(node: NodeState, workload: Workload) -> float:
    """F_n = Σ_m p_m · F_n(m), in GPUs."""
    return sum(p * task_fragmentation(node, demand) for demand, p in workload.tasks)


class FragmentationTally:
    """F_n kept as per-task sums, so the effect of changing one GPU costs one pass over tasks.

    Choosing a GPU for a share asks "what if this GPU took it" once per candidate;
    recomputing F_n from scratch each time would cost a pass over every GPU too.
    """

    __slots__ = ("_idle", "_slivers", "_usable", "_workload")

    def __init__(self, node: NodeState, workload: Workload) -> None:
        self._workload = workload
        frees = [free_capacity(g) if node.offers else 0.0 for g in node.gpus]
        self._idle = sum(frees)
        self._usable: list[int] = []
        self._slivers: list[float] = []
        for demand, _ in workload.tasks:
            usable = [node.offers and demand.usable_on(g) for g in node.gpus]
            self._usable.append(sum(usable))
            self._slivers.append(sum(f for f, u in zip(frees, usable, strict=True) if not u))

    def total(self) -> float:
        """F_n of the node as it is."""
        return self._sum(self._idle, self._usable, self._slivers)

    def total_if(self, old: GpuState, new: GpuState) -> float:
        """F_n if ``old`` (a GPU of a node that offers) became ``new``."""
        old_free, new_free = free_capacity(old), free_capacity(new)
        usable: list[int] = []
        slivers: list[float] = []
        for (demand, _), count, sliver in zip(
            self._workload.tasks, self._usable, self._slivers, strict=True
        ):
            was, now = demand.usable_on(old), demand.usable_on(new)
            usable.append(count - was + now)
            slivers.append(sliver - (0.0 if was else old_free) + (0.0 if now else new_free))
        return self._sum(self._idle - old_free + new_free, usable, slivers)

    def _sum(self, idle: float, usable: list[int], slivers: list[float]) -> float:
        total = 0.0
        for (demand, p), count, sliver in zip(self._workload.tasks, usable, slivers, strict=True):
            total += p * (idle if count < demand.gpus_needed else sliver)
        return total
