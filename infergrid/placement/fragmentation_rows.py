"""FGD's fragmentation over many nodes at once: ``fragmentation`` in numpy, for ``OfferIndex``.

The extender scores a pod on every node that fits, and fgd's exact core costs
about a millisecond a node: seconds at 5,000 nodes whenever a new pod shape or
a new learned workload leaves nothing to reuse. Here the same arithmetic runs
over arrays of shape (GPU position, node): one array row per GPU index (padded
with GPUs that offer nothing), one column per node. Sums over a node's GPUs are
then a few additions of whole contiguous rows.

Every result is bit for bit the exact core's: sums run GPU after GPU and task
after task in the order ``node_fragmentation`` and ``FragmentationTally`` add
them (never numpy's pairwise sums), and a sliver is dropped by multiplying it
by 0 (exact, as capacities are finite) where the core adds 0.0, so equal inputs
give equal floats, ties stay ties, and the extender and the simulator (which
runs the exact core) choose alike. The property tests in
``tests/placement/test_offers.py`` hold the two equal. Nodes here offer (fit
needs it for any GPU pod).
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Final

import numpy as np
import numpy.typing as npt

from infergrid.placement.fragmentation import Workload
from infergrid.placement.state import ALL_CORES

Ints = npt.NDArray[np.int64]
Flags = npt.NDArray[np.bool_]
Floats = npt.NDArray[np.float64]

_DIGITS: Final = 9
"""As ``gpu_choice``: fragmentation increases are compared at this many decimals."""


@dataclass(frozen=True, slots=True)
class GpuColumns:
    """Per GPU position and node (arrays of shape (GPUs, nodes)), what fragmentation reads
    and what a share changes.

    ``free`` is ``free_capacity``; ``whole`` is ``takes_whole``; ``room`` says the
    GPU takes shares at all (available, no MIG, not held whole, a slot left), so
    a share fits where ``room`` and its memory and SMs do.
    """

    free: Floats
    whole: Flags
    room: Flags
    free_mib: Ints
    free_cores: Ints
    memory: Ints
    assigned_mib: Ints
    used_mib: Ints
    assigned_cores: Ints
    slots_left: Ints

    def usable(self, whole_gpus: int, memory_mib: int, cores: int) -> Flags:
        """``Demand.usable_on`` of each GPU: idle for whole GPUs, room for a share."""
        return _usable(self.whole, self.room, self.free_mib, self.free_cores, whole_gpus,
                       memory_mib, cores)  # fmt: skip

    def with_share(self, col: Ints, memory_mib: int, cores: int) -> "GpuColumns":
        """Each node with one more share on its GPU ``col``, as ``reserved_share`` makes it."""
        at = (col, np.arange(len(col)))
        return self._set(at, self.after_share(at, memory_mib, cores))

    def after_share(
        self, at: tuple[npt.NDArray[np.intp] | slice, ...], memory_mib: int, cores: int
    ) -> dict[str, npt.NDArray[np.generic]]:
        """The GPUs at ``at`` (any index) with one more share each: their new columns."""
        memory = self.memory[at]
        assigned = self.assigned_mib[at] + memory_mib
        taken = self.assigned_cores[at] + cores
        free_mib = np.maximum(0, memory - np.maximum(assigned, self.used_mib[at]))
        free_cores = np.maximum(0, ALL_CORES - taken)
        # GPUs without memory take no share; dividing by 1 there keeps every value finite.
        free = (free_mib / np.maximum(memory, 1) + free_cores / ALL_CORES) / 2
        return {
            "free": free,
            "whole": np.zeros(memory.shape, dtype=np.bool_),  # a share's GPU is not idle
            "room": self.slots_left[at] > 1,
            "free_mib": free_mib,
            "free_cores": free_cores,
            "assigned_mib": assigned,
            "assigned_cores": taken,
            "slots_left": self.slots_left[at] - 1,
        }

    def with_whole(self, chosen: Flags) -> "GpuColumns":
        """Each node with its ``chosen`` GPUs held whole: nothing left on them to offer."""
        at = np.nonzero(chosen)
        changes = {
            "free": 0.0,
            "whole": False,
            "room": False,
            "free_mib": 0,
            "free_cores": 0,
            "assigned_mib": self.assigned_mib[at] + self.memory[at],
            "assigned_cores": self.assigned_cores[at] + ALL_CORES,
        }
        return self._set(at, changes)

    def _set(
        self, at: tuple[npt.NDArray[np.intp], ...], changes: Mapping[str, object]
    ) -> "GpuColumns":
        copies = {}
        for name, value in changes.items():
            column = getattr(self, name).copy()
            column[at] = value
            copies[name] = column
        return replace(self, **copies)


@dataclass(frozen=True, slots=True)
class HostColumns:
    """Per node: its GPU model (a number from the index's table), whether it tracks
    CPU (``NodeState.host``), and its free millicores where it does."""

    product: Ints
    tracked: Flags
    free_cpu: Ints

    def less_cpu(self, cpu_milli: int) -> "HostColumns":
        """Each node once a pod's ``cpu_milli`` is reserved (``reserve_host``)."""
        if not cpu_milli:
            return self
        return replace(self, free_cpu=self.free_cpu - cpu_milli)


@dataclass(frozen=True, slots=True)
class _Task:
    popularity: float
    demand: int
    """Position of its GPU ask (whole GPUs, MiB, cores) in ``RowPlan.demands``."""
    needs: int
    wants_gpu: bool
    cpu_milli: int
    models: Ints | None
    """Product numbers it accepts; None: any."""


@dataclass(frozen=True, slots=True)
class RowPlan:
    """A workload compiled against an index's product numbers: distinct GPU asks, the tasks
    in the workload's order, and each product's contention (by number)."""

    demands: tuple[tuple[int, int, int], ...]
    tasks: tuple[_Task, ...]
    contention: Floats

    @staticmethod
    def of(workload: Workload, products: Mapping[str, int]) -> "RowPlan":
        """``products`` numbers every model the rows carry."""
        demands: dict[tuple[int, int, int], int] = {}
        tasks = []
        for demand, p in workload.tasks:
            ask = (demand.whole_gpus, demand.memory_mib, demand.cores)
            at = demands.setdefault(ask, len(demands))
            models = None
            if demand.gpu_models:
                models = np.array([products.get(m, -1) for m in demand.gpu_models], np.int64)
            tasks.append(
                _Task(p, at, demand.gpus_needed, demand.wants_gpu, demand.cpu_milli, models)
            )
        contention = np.zeros(max(products.values(), default=-1) + 1)
        for model, number in products.items():
            contention[number] = workload.contention.get(model, 0.0)
        return RowPlan(tuple(demands), tuple(tasks), contention)

    def shut_out(self, hosts: HostColumns) -> list[Flags]:
        """Per task, the nodes it cannot use whatever their GPUs (``Demand.shut_out``)."""
        rows = len(hosts.product)
        shut = []
        for task in self.tasks:
            if not task.wants_gpu:
                shut.append(np.ones(rows, dtype=np.bool_))
                continue
            out = np.zeros(rows, dtype=np.bool_)
            if task.models is not None:
                out |= ~np.isin(hosts.product, task.models)
            shut.append(out | (hosts.tracked & (hosts.free_cpu < task.cpu_milli)))
        return shut


@dataclass(frozen=True, slots=True)
class NodeRows:
    """Many nodes' GPUs and hosts: the before or after a row scorer compares."""

    gpus: GpuColumns
    hosts: HostColumns


RowScorer = Callable[[NodeRows, NodeRows, RowPlan, Workload], Floats]
"""A raw scorer over many nodes: (nodes before, nodes after placing the pod, the workload
compiled for them, the workload) → each node's raw score, exactly the scalar scorer's."""


def fgd_rows(before: NodeRows, after: NodeRows, plan: RowPlan, workload: Workload) -> Floats:
    """``fgd_score`` of each node: the decrease of node fragmentation."""
    return fragmentation(before.gpus, before.hosts, plan) - fragmentation(
        after.gpus, after.hosts, plan
    )


def running_sum(per_gpu: Floats) -> Floats:
    """Per node, its GPUs' values added in index order from 0.0, as a Python loop adds."""
    total = np.zeros(per_gpu.shape[1])
    for row in per_gpu:
        total = total + row
    return total


def fragmentation(gpus: GpuColumns, hosts: HostColumns, plan: RowPlan) -> Floats:
    """``node_fragmentation`` of each node."""
    idle = running_sum(gpus.free)
    parts = [_count_and_slivers(gpus, gpus.usable(*ask)) for ask in plan.demands]
    return _total(plan, plan.shut_out(hosts), idle, parts)


def least_fragmenting(
    gpus: GpuColumns, hosts: HostColumns, plan: RowPlan, takers: Flags, memory_mib: int, cores: int
) -> Ints:
    """Per node, the GPU position ``least_fragmenting_gpu`` picks among ``takers`` for the
    share: least increase (``FragmentationTally.total_if``, rounded), then least free MiB,
    then fewest free SMs, then lowest index.

    Every GPU of every node is tried at once: ``total_if``'s arithmetic on (GPU, node) arrays.
    """
    shut = plan.shut_out(hosts)
    idle = running_sum(gpus.free)
    usable = [gpus.usable(*ask) for ask in plan.demands]
    parts = [_count_and_slivers(gpus, u) for u in usable]
    before = _total(plan, shut, idle, parts)
    everywhere = (slice(None), slice(None))
    new = gpus.after_share(everywhere, memory_mib, cores)
    old_free, new_free = gpus.free, new["free"]
    changed = []
    for ask, was, (count, slivers) in zip(plan.demands, usable, parts, strict=True):
        now = _usable(new["whole"], new["room"], new["free_mib"], new["free_cores"], *ask)
        # total_if: sliver - (0.0 if was else old) + (0.0 if now else new), with x * 0 = 0.0.
        changed.append((count - was + now, slivers - old_free * ~was + new_free * ~now))
    total = _total(plan, shut, idle - old_free + new_free, changed)
    increase = np.where(takers, np.round(total - before, _DIGITS), np.inf)
    return _first_least(takers, increase, gpus.free_mib, gpus.free_cores)


def _first_least(takers: Flags, increase: Floats, free_mib: Ints, free_cores: Ints) -> Ints:
    """Per node, the first taker GPU with the least (increase, free MiB, free SMs)."""
    most = np.iinfo(np.int64).max
    tied = takers & (increase == increase.min(axis=0))
    for key in (free_mib, free_cores):
        keyed = np.where(tied, key, most)
        tied &= keyed == keyed.min(axis=0)
    return tied.argmax(axis=0)


def _usable(
    whole: Flags,
    room: Flags,
    free_mib: Ints,
    free_cores: Ints,
    whole_gpus: int,
    memory_mib: int,
    cores: int,
) -> Flags:
    """``Demand.usable_on`` over GPUs given column by column (any shape)."""
    if whole_gpus:
        return whole
    if memory_mib <= 0:
        return np.zeros_like(room)
    return room & (free_mib >= memory_mib) & (free_cores >= cores)


def _count_and_slivers(gpus: GpuColumns, usable: Flags) -> tuple[Ints, Floats]:
    """How many GPUs of each node the ask can use, and the free capacity of the others."""
    return usable.sum(axis=0), running_sum(gpus.free * ~usable)


def _total(
    plan: RowPlan, shut: list[Flags], idle: Floats, parts: list[tuple[Ints, Floats]]
) -> Floats:
    """Σ_m p_m · F_n(m), task after task (per node, or per GPU tried and node)."""
    total = np.zeros(idle.shape)
    for task, out in zip(plan.tasks, shut, strict=True):
        count, slivers = parts[task.demand]
        total = total + task.popularity * np.where(out | (count < task.needs), idle, slivers)
    return total
