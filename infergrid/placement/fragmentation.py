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
* As in the paper, a task may also name CPU millicores and the GPU models it
  accepts, or ask for no GPU at all. Where it cannot run on n whatever the GPUs
  (no GPU asked, a model it does not accept, or less CPU free than it needs on a
  node that tracks CPU) all of n's free capacity is fragment to it as well.
* Node fragmentation F_n = Σ_m p_m · F_n(m). The FGD score of a placement is
  the increase F_n(after) − F_n(before); lower is better.

Containers are the tasks (a pod's GPU containers each count once); MIG
requests take no part, since MIG GPUs are carved up ahead of time. The
extender's tasks carry no CPU and no models; the trace simulator's do.
"""

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from infergrid.errors import ContractError
from infergrid.placement.state import ALL_CORES, GpuState, NodeState
from infergrid.pod_request import ContainerGpuRequest

WORKLOAD_WINDOW: Final = 1000
"""Pods, most recent last, that ``LearnedWorkload`` learns from: recent enough to follow
what people deploy now, long enough that one burst does not decide."""

TYPICAL_COVERAGE: Final = 0.95
"""Like the paper, keep the most frequent task types that together cover 95% of tasks."""

MAX_TASK_TYPES: Final = 16
"""At most this many task types, so scoring a node stays a few hundred comparisons."""

_POPULARITY_SLACK: Final = 1e-6

BEFORE_CACHE: Final = 8192
"""Node states whose fragmentation ``fragmentation_before`` remembers."""


@dataclass(frozen=True, slots=True)
class Demand:
    """A task type's demand: ``whole_gpus`` GPUs, or a share (``memory_mib``, ``cores``).

    ``cpu_milli`` and ``gpu_models`` (empty: any) are what the paper's typical
    pods also carry; a task with CPU and no GPU at all is a CPU-only pod.
    """

    whole_gpus: int = 0
    memory_mib: int = 0
    cores: int = 0
    cpu_milli: int = 0
    gpu_models: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if min(self.whole_gpus, self.memory_mib, self.cores, self.cpu_milli) < 0:
            raise ContractError("demand", f"amounts must not be negative: {self}")
        share = self.memory_mib > 0 or self.cores > 0
        if self.whole_gpus > 0 and share:
            raise ContractError("demand", f"whole GPUs or a share, not both: {self}")
        if not (self.whole_gpus > 0 or share or self.cpu_milli > 0):
            raise ContractError("demand", f"needs GPUs, a share or CPU: {self}")
        if share and not (self.memory_mib > 0 and 0 <= self.cores <= ALL_CORES):
            raise ContractError("demand", f"a share needs memory, and cores from 0 to 100: {self}")

    @property
    def wants_gpu(self) -> bool:
        """Whether the task asks for any GPU; CPU-only tasks do not."""
        return self.whole_gpus > 0 or self.memory_mib > 0

    @property
    def gpus_needed(self) -> int:
        """How many usable GPUs the task needs on one node."""
        return self.whole_gpus or 1

    def shut_out(self, node: NodeState) -> bool:
        """Whether the task cannot run on ``node`` whatever its GPUs: it asks for no GPU,
        for another model, or for more CPU than the node (where it tracks CPU) has free."""
        if not self.wants_gpu:
            return True
        if self.gpu_models and node.product not in self.gpu_models:
            return True
        return node.host is not None and node.host.free_cpu_milli < self.cpu_milli

    def usable_on(self, gpu: GpuState) -> bool:
        """Whether this task could be placed on ``gpu`` as it is now (never, without a GPU)."""
        if self.whole_gpus:
            return gpu.takes_whole()
        return self.memory_mib > 0 and gpu.takes_share(self.memory_mib, self.cores)

    @staticmethod
    def of(
        container: ContainerGpuRequest,
        cpu_milli: int = 0,
        gpu_models: frozenset[str] = frozenset(),
    ) -> "Demand | None":
        """The demand of one container's request, with the CPU and GPU models its pod asks
        for; None for MIG or no GPU."""
        if container.kind == "whole":
            return Demand(whole_gpus=container.gpus, cpu_milli=cpu_milli, gpu_models=gpu_models)
        if container.kind == "share":
            return Demand(
                memory_mib=container.memory_mib,
                cores=container.cores,
                cpu_milli=cpu_milli,
                gpu_models=gpu_models,
            )
        return None


_NO_CONTENTION: Final[Mapping[str, float]] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Workload:
    """Task types and their popularity, which sum to 1.

    ``contention`` says how contested each GPU model is in the cluster the
    workload runs on (0 is average; see ``fgd_cluster_aware.model_contention``), and
    ``cluster_cpu_per_gpu`` how many CPU millicores that cluster has per GPU
    (0: not known). Only fgd-cluster-aware reads them; they take no part in equality.
    """

    tasks: tuple[tuple[Demand, float], ...]
    contention: Mapping[str, float] = field(default_factory=lambda: _NO_CONTENTION, compare=False)
    cluster_cpu_per_gpu: float = field(default=0.0, compare=False)

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ContractError("workload", "needs at least one task type")
        if any(not (math.isfinite(p) and p > 0) for _, p in self.tasks):
            raise ContractError("workload", "every popularity must be a positive number")
        if abs(sum(p for _, p in self.tasks) - 1.0) > _POPULARITY_SLACK:
            raise ContractError("workload", "popularities must sum to 1")
        if not (math.isfinite(self.cluster_cpu_per_gpu) and self.cluster_cpu_per_gpu >= 0):
            raise ContractError("workload", "cluster CPU per GPU must be a number, 0 or more")

    @staticmethod
    def of(weights: Iterable[tuple[Demand, float]]) -> "Workload":
        """A workload from any positive weights, scaled to sum to 1."""
        pairs = tuple(weights)
        total = sum(w for _, w in pairs)
        if not (math.isfinite(total) and total > 0):
            raise ContractError("workload", "weights must be positive numbers")
        return Workload(tuple((d, w / total) for d, w in pairs))

    @staticmethod
    def from_demands(
        demands: Iterable[Demand],
        coverage: float = TYPICAL_COVERAGE,
        max_types: int = MAX_TASK_TYPES,
    ) -> "Workload":
        """The typical task types among ``demands``; ``DEFAULT_WORKLOAD`` if none.

        Types are kept most frequent first until they cover ``coverage`` of the
        tasks or number ``max_types``; ties go to the smaller demand, so the
        result does not depend on arrival order.
        """
        counts = Counter(demands)
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


def _size(demand: Demand) -> tuple[int, int, int, int, list[str]]:
    return (
        demand.whole_gpus,
        demand.memory_mib,
        demand.cores,
        demand.cpu_milli,
        sorted(demand.gpu_models),
    )


def free_capacity(gpu: GpuState) -> float:
    """free(g): the mean of the free memory and free SM fractions; 0 if it offers nothing."""
    if not gpu.available or gpu.mig_enabled:
        return 0.0
    return (gpu.free_mib / gpu.memory_mib + gpu.free_cores / ALL_CORES) / 2


def task_fragmentation(node: NodeState, demand: Demand) -> float:
    """F_n(m) for one task type."""
    return node_fragmentation(node, Workload(((demand, 1.0),)))


def node_fragmentation(node: NodeState, workload: Workload) -> float:
    """F_n = Σ_m p_m · F_n(m), in GPUs.

    Tasks that ask the GPUs for the same (whole GPUs, or share memory and cores)
    see the same usable GPUs and slivers, so each such demand costs one pass over
    the GPUs; the sums run in the same order as task by task, so the result is too.
    """
    if not node.offers:
        return 0.0
    views = _views(node)
    idle = 0.0
    for view in views:
        idle += view.free
    seen: dict[tuple[int, int, int], tuple[int, float]] = {}
    total = 0
    for demand, p in workload.tasks:
        key = (demand.whole_gpus, demand.memory_mib, demand.cores)
        found = seen.get(key)
        if found is None:
            found = seen[key] = _usable_and_slivers(views, demand)
        usable, slivers = found
        shut = demand.shut_out(node)
        total += p * (idle if shut or usable < demand.gpus_needed else slivers)
    return total


_before: dict[tuple[int, int], tuple[NodeState, Workload, float]] = {}


def fragmentation_before(node: NodeState, workload: Workload) -> float:
    """``node_fragmentation`` of a node a scorer compares placements on: the same node
    object is scored for one pod shape after another, and the first term of each ΔF is
    this one. Remembered by identity (states hold NVLink maps, so they do not hash); an
    entry keeps its node and workload alive, so their ids cannot be reused meanwhile."""
    key = (id(node), id(workload))
    known = _before.get(key)
    if known is not None and known[0] is node and known[1] is workload:
        return known[2]
    if len(_before) >= BEFORE_CACHE:
        del _before[next(iter(_before))]  # the oldest
    value = node_fragmentation(node, workload)
    _before[key] = (node, workload, value)
    return value


@dataclass(frozen=True, slots=True)
class _GpuView:
    """What fragmentation reads of one GPU, worked out once per node instead of once per task.

    ``room`` is (free MiB, free cores) when the GPU takes shares at all, else None.
    """

    free: float
    whole: bool
    room: tuple[int, int] | None


def _view(gpu: GpuState) -> _GpuView:
    shares = (
        gpu.available
        and not gpu.mig_enabled
        and not gpu.held_whole
        and gpu.shares < gpu.share_slots
    )
    room = (gpu.free_mib, gpu.free_cores) if shares else None
    return _GpuView(free_capacity(gpu), gpu.takes_whole(), room)


def _views(node: NodeState) -> list[_GpuView]:
    return [_view(g) for g in node.gpus]


def _usable(view: _GpuView, demand: Demand) -> bool:
    """``demand.usable_on`` of the GPU behind ``view``, from the view alone."""
    if demand.whole_gpus:
        return view.whole
    room = view.room
    return (
        room is not None
        and demand.memory_mib > 0
        and room[0] >= demand.memory_mib
        and room[1] >= demand.cores
    )


def _usable_and_slivers(views: list[_GpuView], demand: Demand) -> tuple[int, float]:
    """How many GPUs the demand can use, and the free capacity on the others."""
    slivers = 0.0
    usable = 0
    for view in views:
        if _usable(view, demand):
            usable += 1
        else:
            slivers += view.free
    return usable, slivers


class FragmentationTally:
    """F_n kept as sums per GPU demand, so the effect of changing one GPU costs one pass over
    the distinct demands.

    Choosing a GPU for a share asks "what if this GPU took it" once per candidate;
    recomputing F_n from scratch each time would cost a pass over every GPU too.
    """

    __slots__ = ("_demands", "_idle", "_keys", "_shut_out", "_slivers", "_usable", "_workload")

    def __init__(self, node: NodeState, workload: Workload) -> None:
        self._workload = workload
        views = _views(node)
        frees = [v.free if node.offers else 0.0 for v in views]
        self._idle = sum(frees)
        index: dict[tuple[int, int, int], int] = {}
        self._keys: list[int] = []
        self._demands: list[Demand] = []
        for demand, _ in workload.tasks:
            key = (demand.whole_gpus, demand.memory_mib, demand.cores)
            if key not in index:
                index[key] = len(self._demands)
                self._demands.append(demand)
            self._keys.append(index[key])
        self._usable: list[int] = []
        self._slivers: list[float] = []
        for demand in self._demands:
            usable = [node.offers and _usable(v, demand) for v in views]
            self._usable.append(sum(usable))
            self._slivers.append(sum(f for f, u in zip(frees, usable, strict=True) if not u))
        self._shut_out = [demand.shut_out(node) for demand, _ in workload.tasks]

    def total(self) -> float:
        """F_n of the node as it is."""
        return self._sum(self._idle, self._usable, self._slivers)

    def total_if(self, old: GpuState, new: GpuState) -> float:
        """F_n if ``old`` (a GPU of a node that offers) became ``new``."""
        old_free, new_free = free_capacity(old), free_capacity(new)
        old_view, new_view = _view(old), _view(new)
        usable: list[int] = []
        slivers: list[float] = []
        for demand, count, sliver in zip(self._demands, self._usable, self._slivers, strict=True):
            was, now = _usable(old_view, demand), _usable(new_view, demand)
            usable.append(count - was + now)
            slivers.append(sliver - (0.0 if was else old_free) + (0.0 if now else new_free))
        return self._sum(self._idle - old_free + new_free, usable, slivers)

    def _sum(self, idle: float, usable: list[int], slivers: list[float]) -> float:
        total = 0.0
        for (demand, p), key, shut in zip(
            self._workload.tasks, self._keys, self._shut_out, strict=True
        ):
            fragment = idle if shut or usable[key] < demand.gpus_needed else slivers[key]
            total += p * fragment
        return total
