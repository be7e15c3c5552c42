"""What each node's GPUs offer, kept in arrays, so a pod is checked against thousands at once.

Filter asks the same question of every node in the cluster for each pod. For
the pods inference fleets run most (one GPU container asking for a share of a
GPU or for whole GPUs) the answer per node is a few comparisons over numbers
that change only when the node does. ``OfferIndex`` keeps those numbers, one
row per node, rewritten from the node's ``NodeState`` when it changes, and
answers feasibility, binpack and spread raw scores, and rejection reasons for
many rows at once with numpy.

Every answer is the core's own: feasibility equals ``fit(...).fits`` and a raw
score equals ``policy.raw_score(node, fit(...).after, workload)`` (the
property tests check both, to the bit). Binpack and spread read fullness;
fgd and fgd-cluster-aware read fragmentation, computed over the rows by
``fragmentation_rows`` (with fgd's own choice of GPU for a share), and the
host columns, so a ``HostRequest`` (CPU, memory, models) is checked and scored
here too. The whole-GPU sets come from ``choose_gpu_set`` itself, worked out
when a row is written and memoised per NVLink layout and free set. What the
index does not answer it says so with None, and the caller runs ``fit``: MIG
requests, pods with several GPU containers or none, nodes whose GPUs are out
of index order or too many for a bitmask, nodes that time-slice their GPUs
(whose whole-GPU sets the policy picks by holders), and the scores of the
simulation-only policies.

Rejection reasons are one line per node. Stale nodes and whole-GPU requests
get the reason ``fit`` gives (for whole GPUs: the count with the busy GPUs counted
by cause, or the NVLink set missing); a share
request names the GPU with most free memory among those that take shares,
with every reason ``why_not_share`` gives for it, or counts why no GPU takes
shares at all.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from typing import Final

import numpy as np
import numpy.typing as npt

from infergrid.constants import RESOURCE_VGPU, TOPOLOGY_NVLINK
from infergrid.placement.fgd_cluster_aware import fgd_cluster_aware_rows, fgd_cluster_aware_score
from infergrid.placement.fit import fit
from infergrid.placement.fragmentation import free_capacity
from infergrid.placement.fragmentation_rows import (
    GpuColumns,
    HostColumns,
    NodeRows,
    RowPlan,
    RowScorer,
    fgd_rows,
    least_fragmenting,
)
from infergrid.placement.gpu_choice import emptiest_gpu, fullest_gpu, least_fragmenting_gpu
from infergrid.placement.host import HostRequest
from infergrid.placement.policy import Policy
from infergrid.placement.scoring import GPU_COUNT_WEIGHT, binpack_score, fgd_score, spread_score
from infergrid.placement.shortfall import BUSY_CAUSES, busy_cause, why_not_share
from infergrid.placement.state import GpuState, NodeState
from infergrid.placement.topology import choose_gpu_set
from infergrid.pod_request import ContainerGpuRequest, PodGpuRequest

Rows = npt.NDArray[np.int64]
Flags = npt.NDArray[np.bool_]
Floats = npt.NDArray[np.float64]
Objects = npt.NDArray[np.object_]

MAX_GPUS: Final = 62
"""GPUs a row can hold: a set of them is a bitmask in one int64. Wider nodes are not indexed."""

MAX_SIGNATURES: Final = 1 << 16
"""Memoised (NVLink layout, free set) answers kept before the memo starts over; rows keep theirs."""

_NO_SET: Final = -1
_CORES_SPAN: Final = 256
"""Free SMs (0..100 percent) fit below this, so one int orders GPUs by free memory, then SMs."""

_SCORE_SIGNS: Final = {binpack_score: 1.0, spread_score: -1.0}
"""Raw scorers computed here: both are ``fullness(after)``, binpack as is, spread negated."""

_SHARE_ORDERS: Final = {fullest_gpu: 1, emptiest_gpu: -1}
"""Share choosers computed here: least free first (binpack) or most free first (spread)."""

_ROW_SCORERS: Final[dict[object, RowScorer]] = {
    fgd_score: fgd_rows,
    fgd_cluster_aware_score: fgd_cluster_aware_rows,
}
"""Raw scorers over fragmentation computed here (``fragmentation_rows``), with fgd's own
choice of GPU for a share (``least_fragmenting_gpu``)."""

# Why a GPU takes no share at all, in the order ``why_not_share`` checks; 0 = it takes shares.
_TAKES_SHARES, _UNAVAILABLE, _MIG, _HELD_WHOLE, _NO_GPU = 0, 1, 2, 3, 4
_BLOCKED_AS: Final = (
    (_UNAVAILABLE, "unavailable"),
    (_MIG, "in MIG mode"),
    (_HELD_WHOLE, "held whole by another pod"),
)


@dataclass(frozen=True, slots=True)
class Rejections:
    """Why each rejected row does not fit: one line per row, and per row the resources it
    is short of (one per reason the line gives), which a caller may keep with the line."""

    reasons: list[str]
    short: list[tuple[str, ...]]

    @property
    def resources(self) -> list[str]:
        """The resources short, row after row: what filter counts for its metrics."""
        return list(chain.from_iterable(self.short))


def single_container(request: PodGpuRequest) -> ContainerGpuRequest | None:
    """The pod's one share or whole-GPU container, when that is all it asks for; else None."""
    containers = request.gpu_containers
    if len(containers) != 1:
        return None
    (container,) = containers
    if container.kind == "share" or (container.kind == "whole" and container.gpus >= 1):
        return container
    return None


_COLUMNS: Final = {
    # Per node.
    "_offers": (np.bool_, "node", False),
    "_gpu_count": (np.int64, "node", 0),
    "_free_count": (np.int64, "node", 0),  # GPUs that take_whole()
    "_largest": (np.int64, "node", 0),  # largest NVLink-connected set of those
    "_total": (np.int64, "node", 0),  # fullness: memory of available GPUs
    "_held": (np.int64, "node", 0),  # fullness: held MiB on available GPUs
    "_available": (np.int64, "node", 0),
    "_busy": (np.int64, "node", 0),  # fullness: busy available GPUs
    # Per GPU, in index order.
    "_block": (np.int8, "gpu", _NO_GPU),
    "_share_open": (np.bool_, "gpu", False),  # takes a share of nothing: block 0, a slot left
    "_free_mib": (np.int64, "gpu", 0),
    "_free_cores": (np.int64, "gpu", 0),
    "_memory": (np.int64, "gpu", 0),
    "_assigned_mib": (np.int64, "gpu", 0),
    "_used": (np.int64, "gpu", 0),
    "_gpu_held": (np.int64, "gpu", 0),
    "_gpu_busy": (np.bool_, "gpu", False),
    "_gpu_cause": (np.int8, "gpu", -1),  # busy_cause, -1 for none
    "_whole_gain": (np.int64, "gpu", 0),  # held MiB added by holding the GPU whole
    "_frac": (np.float64, "gpu", 0.0),  # fragmentation: free_capacity
    "_whole_ok": (np.bool_, "gpu", False),  # takes_whole
    "_assigned_cores": (np.int64, "gpu", 0),
    "_slots_left": (np.int64, "gpu", 0),
    # Per node, what a HostRequest and fragmentation read of its host.
    "_product": (np.int64, "node", 0),  # the GPU model's number in _product_ids
    "_tracked": (np.bool_, "node", False),  # node.host is not None
    "_free_cpu": (np.int64, "node", 0),
    "_free_memory": (np.int64, "node", 0),
    "_written": (np.int64, "node", -1),  # when the row was last written or dropped: a count
    # Per node, count and NVLink required: the bitmask choose_gpu_set picks, or _NO_SET.
    "_sets": (np.int64, "sets", _NO_SET),
}
"""The arrays of an ``OfferIndex``: (dtype, shape, fill of rows and GPUs not written)."""


class OfferIndex:
    """One row per node of what its GPUs offer; rows are rewritten by ``update``.

    Per GPU (columns in index order): whether it takes shares and why not,
    free MiB, free SM percent, and what fullness reads; per node: whether it
    offers at all, and the GPU set ``choose_gpu_set`` picks for each count,
    with and without NVLink required. Queries take row numbers from ``rows``.
    """

    def __init__(self) -> None:
        self._row_of: dict[str, int] = {}
        self._nodes: list[NodeState | None] = []
        self._stale_why: list[tuple[str, str] | None] = []
        self._spare: list[int] = []
        self._signatures: dict[tuple[object, int], npt.NDArray[np.int64]] = {}
        self._product_ids: dict[str, int] = {}
        self._writes = 0
        self._height = 0
        self._width = 0
        self._alloc(16, 8)

    # Rows.

    def rows(self, names: Sequence[str]) -> Rows:
        """The row of each name; -1 for nodes not indexed."""
        return np.fromiter(
            map(self._row_of.get, names, repeat(-1)), dtype=np.int64, count=len(names)
        )

    def node(self, row: int) -> NodeState:
        """The state a row was last written from."""
        node = self._nodes[row]
        assert node is not None, f"row {row} is empty"
        return node

    def update(self, node: NodeState) -> bool:
        """Writes the node's row; False (and no row) when the node cannot be indexed."""
        gpus = node.gpus
        if (
            len(gpus) > MAX_GPUS
            or any(a.index > b.index for a, b in zip(gpus, gpus[1:], strict=False))
            or any(g.time_sliced for g in gpus)
        ):
            self.discard(node.name)
            return False
        row = self._row_of.get(node.name)
        if row is None:
            row = self._spare.pop() if self._spare else len(self._nodes)
            if row == len(self._nodes):
                self._nodes.append(None)
                self._stale_why.append(None)
            self._row_of[node.name] = row
        self._alloc(max(self._height, row + 1), max(self._width, len(gpus)))
        self._nodes[row] = node
        self._stale_why[row] = None
        self._stamp(row)
        self._write(row, node)
        return True

    def discard(self, name: str) -> None:
        """Drops the node's row, if it has one."""
        row = self._row_of.pop(name, None)
        if row is not None:
            self._nodes[row] = None
            self._offers[row] = False
            self._stamp(row)
            self._spare.append(row)

    def written(self, rows: Rows) -> Rows:
        """When each row was last written or dropped, as a count of writes: an answer about a
        row holds while its count stays the same."""
        return np.take(self._written, rows)

    def _stamp(self, row: int) -> None:
        self._writes += 1
        self._written[row] = self._writes

    # Questions about many rows.

    @staticmethod
    def answers(request: PodGpuRequest) -> bool:
        """Whether ``fits`` and ``why_not`` answer for the pod: one share or whole-GPU container."""
        return single_container(request) is not None

    @staticmethod
    def scores(request: PodGpuRequest, policy: Policy) -> bool:
        """Whether ``raw_scores`` answers for this pod and policy: binpack or spread scores,
        and for a share their own GPU choice (least or most free); or fgd's and
        fgd-cluster-aware's, with fgd's choice (least fragmenting)."""
        container = single_container(request)
        if container is None:
            return False
        share = policy.choice.share
        if policy.raw_score in _SCORE_SIGNS:
            return container.kind == "whole" or share in _SHARE_ORDERS
        if policy.raw_score in _ROW_SCORERS:
            return container.kind == "whole" or share is least_fragmenting_gpu
        return False

    def fits(self, rows: Rows, request: PodGpuRequest) -> Flags | None:
        """Per row, whether ``fit(request, node, policy).fits``; None when not answered here.

        As ``fit`` without a ``HostRequest``: the extender's, where kube-scheduler
        has checked CPU, memory and the GPU model before asking.
        """
        container = single_container(request)
        if container is None:
            return None
        if container.kind == "share":
            return self._offers[rows] & self._share_fits(rows, container).any(axis=1)
        return self._offers[rows] & (self._whole_sets(rows, request, container) != _NO_SET)

    def raw_scores(
        self, rows: Rows, request: PodGpuRequest, policy: Policy, host: HostRequest | None = None
    ) -> Floats | None:
        """Per row, ``policy.raw_score(node, fit(request, node, policy, host).after, workload)``,
        NaN where it does not fit; None for requests and policies not answered here (see
        ``scores``)."""
        container = single_container(request)
        if container is None or not self.scores(request, policy):
            return None
        raw = np.full(len(rows), np.nan)
        ok = self._offers[rows] & self._host_fits(rows, host)
        if container.kind == "share":
            takers = self._share_fits(rows, container)
            ok &= takers.any(axis=1)
            placed = takers[ok]
        else:
            sets = self._whole_sets(rows, request, container)
            ok &= sets != _NO_SET
            placed = sets[ok]
        if policy.raw_score in _SCORE_SIGNS:
            raw[ok] = self._fullness_after(rows[ok], placed, container, policy)
        else:
            raw[ok] = self._fragmentation_scores(rows[ok], placed, container, policy, host)
        return raw

    def _fullness_after(
        self, rows: Rows, placed: Flags | Rows, container: ContainerGpuRequest, policy: Policy
    ) -> Floats:
        """binpack's or spread's raw score once the pod is placed: ``placed`` is each row's
        share takers, or its whole-GPU set."""
        if container.kind == "share":
            order = _SHARE_ORDERS[policy.choice.share]
            held, busy = self._after_share(rows, placed, container, order)
        else:
            held, busy = self._after_whole(rows, placed)
        sign = _SCORE_SIGNS[policy.raw_score]
        return sign * (held / self._total[rows] + GPU_COUNT_WEIGHT * busy / self._available[rows])

    def _fragmentation_scores(
        self,
        rows: Rows,
        placed: Flags | Rows,
        container: ContainerGpuRequest,
        policy: Policy,
        host: HostRequest | None,
    ) -> Floats:
        """fgd's or fgd-cluster-aware's raw score once the pod is placed (``placed`` as for
        ``_fullness_after``), over the rows' fragmentation in numpy."""
        plan = RowPlan.of(policy.workload, self._product_ids)
        hosts = HostColumns(self._product[rows], self._tracked[rows], self._free_cpu[rows])
        before = NodeRows(self._gpu_columns(rows), hosts)
        if container.kind == "share":
            memory, cores = container.memory_mib, container.cores
            col = least_fragmenting(before.gpus, hosts, plan, placed.T, memory, cores)
            gpus = before.gpus.with_share(col, memory, cores)
        else:
            gpus = before.gpus.with_whole(((placed >> np.arange(self._width)[:, None]) & 1) > 0)
        after = NodeRows(gpus, hosts.less_cpu(host.cpu_milli if host else 0))
        return _ROW_SCORERS[policy.raw_score](before, after, plan, policy.workload)

    def _gpu_columns(self, rows: Rows) -> GpuColumns:
        """The rows' GPUs as ``fragmentation_rows`` reads them: (GPU position, row) arrays."""
        return GpuColumns(
            free=_take(self._frac, rows),
            whole=_take(self._whole_ok, rows),
            room=_take(self._share_open, rows),
            free_mib=_take(self._free_mib, rows),
            free_cores=_take(self._free_cores, rows),
            memory=_take(self._memory, rows),
            assigned_mib=_take(self._assigned_mib, rows),
            used_mib=_take(self._used, rows),
            assigned_cores=_take(self._assigned_cores, rows),
            slots_left=_take(self._slots_left, rows),
        )

    def _host_fits(self, rows: Rows, host: HostRequest | None) -> Flags:
        """Per row, whether ``host_shortfalls`` finds nothing for a pod that wants GPUs."""
        ok = np.ones(len(rows), dtype=np.bool_)
        if host is None:
            return ok
        if host.gpu_models:
            models = [self._product_ids.get(m, -1) for m in host.gpu_models]
            ok &= np.isin(self._product[rows], models)
        room = (self._free_cpu[rows] >= host.cpu_milli) & (
            self._free_memory[rows] >= host.memory_mib
        )
        return ok & (~self._tracked[rows] | room)

    def why_not(self, rows: Rows, request: PodGpuRequest, policy: Policy) -> Rejections:
        """Why each row (all of which ``fits`` rejected) does not take the request.

        Only for requests ``fits`` answers. Rows that share a reason share its
        string: ``fit`` runs once per distinct reason, not once per node.
        """
        container = single_container(request)
        assert container is not None, "why_not answers only what fits answers"
        reasons = np.empty(len(rows), dtype=object)
        short = np.empty(len(rows), dtype=object)
        stale = ~self._offers[rows]
        for at in np.flatnonzero(stale).tolist():
            reasons[at], resource = self._why_stale(int(rows[at]), request, policy)
            short[at] = (resource,)
        fresh = np.flatnonzero(~stale)
        if container.kind == "share":
            reasons[fresh], short[fresh] = self._why_no_share(rows[fresh], container)
        else:
            reasons[fresh], short[fresh] = self._why_no_whole(rows[fresh], request, policy)
        return Rejections(reasons.tolist(), short.tolist())

    def _why_stale(self, row: int, request: PodGpuRequest, policy: Policy) -> tuple[str, str]:
        """``fit``'s reason for a node that offers nothing, kept with the row: it names the
        heartbeat, not the pod, so one outage does not cost a ``fit`` per node per pod."""
        why = self._stale_why[row]
        if why is None:
            (shortfall,) = fit(request, self.node(row), policy).shortfalls
            why = self._stale_why[row] = (shortfall.message, shortfall.resource)
        return why

    # Shares.

    def _share_fits(self, rows: Rows, container: ContainerGpuRequest) -> Flags:
        """Per row and GPU: ``takes_share(memory, cores)``."""
        return (
            self._share_open[rows]
            & (self._free_mib[rows] >= container.memory_mib)
            & (self._free_cores[rows] >= container.cores)
        )

    def _after_share(
        self, rows: Rows, takers: Flags, container: ContainerGpuRequest, order: int
    ) -> tuple[Rows, Rows]:
        """Fullness's held MiB and busy GPUs once the chooser's GPU takes the share.

        The chooser is a ``min`` over (free MiB, free SMs, index), ascending or
        descending; argmin's first minimum is the lowest index, as there.
        """
        key = order * (self._free_mib[rows] * _CORES_SPAN + self._free_cores[rows])
        key[~takers] = np.iinfo(np.int64).max
        col = np.argmin(key, axis=1)
        mem = self._memory[rows, col]
        grown = np.maximum(
            self._assigned_mib[rows, col] + container.memory_mib, self._used[rows, col]
        )
        held_after = mem - np.maximum(0, mem - grown)
        held = self._held[rows] - self._gpu_held[rows, col] + held_after
        busy = self._busy[rows] - self._gpu_busy[rows, col] + 1
        return held, busy

    def _why_no_share(self, rows: Rows, container: ContainerGpuRequest) -> tuple[Objects, Objects]:
        """The GPU with most free memory among those taking shares, with all its reasons;
        or, where none takes shares, how many are out and why. Reasons per row, and the
        resources each is short of."""
        reasons = np.empty(len(rows), dtype=object)
        resources = np.empty(len(rows), dtype=object)
        block = self._block[rows]
        open_mib = np.where(block == _TAKES_SHARES, self._free_mib[rows], -1)
        col = np.argmax(open_mib, axis=1)
        has = open_mib[np.arange(len(rows)), col] >= 0
        prefix = f"container {container.name!r}: "
        for at in np.flatnonzero(has).tolist():
            gpu = self.node(int(rows[at])).gpus[int(col[at])]
            found = why_not_share(gpu, container.memory_mib, container.cores)
            reasons[at] = "; ".join(prefix + s.reason for s in found)  # as Shortfall.message
            resources[at] = tuple(s.resource for s in found)
        none = np.flatnonzero(~has)
        columns = [self._gpu_count[rows[none]]]
        columns += [(block[none] == code).sum(axis=1) for code, _ in _BLOCKED_AS]

        def line(first: int) -> tuple[str, str]:
            size, *out = (int(c[first]) for c in columns)
            if size == 0:
                return prefix + "node has no GPUs", RESOURCE_VGPU
            parts = ", ".join(
                f"{n} {why}" for n, (_, why) in zip(out, _BLOCKED_AS, strict=True) if n
            )
            return f"{prefix}none of {size} GPUs takes a share: {parts}", RESOURCE_VGPU

        lines, short = _per_group(_packed(columns), line)
        reasons[none] = lines
        resources[none] = _singles(short)
        return reasons, resources

    # Whole GPUs.

    def _whole_sets(
        self, rows: Rows, request: PodGpuRequest, container: ContainerGpuRequest
    ) -> Rows:
        """Per row, the bitmask of the GPUs ``choose_gpu_set`` gives, or ``_NO_SET``."""
        count = container.gpus
        if count > self._width:
            return np.full(len(rows), _NO_SET, dtype=np.int64)
        nvlink = request.topology == TOPOLOGY_NVLINK and count > 1
        return self._sets[rows, count, int(nvlink)]

    def _after_whole(self, rows: Rows, sets: Rows) -> tuple[Rows, Rows]:
        """Fullness's held MiB and busy GPUs once the chosen GPUs are held whole."""
        chosen = (sets[:, None] >> np.arange(self._width)) & 1
        held = self._held[rows] + (chosen * self._whole_gain[rows]).sum(axis=1)
        busy = self._busy[rows] + (chosen * ~self._gpu_busy[rows]).sum(axis=1)
        return held, busy

    def _why_no_whole(
        self, rows: Rows, request: PodGpuRequest, policy: Policy
    ) -> tuple[Objects, Objects]:
        """``fit``'s reason, worked out once per distinct (GPUs, free, largest NVLink set,
        busy GPUs of each cause): nothing else goes into it, so every node of a group shares
        the line, as kube-scheduler's summary of a pod's rejections wants."""
        columns = [self._gpu_count[rows], self._free_count[rows], self._largest[rows]]
        causes = self._gpu_cause[rows]
        columns += [(causes == cause).sum(axis=1) for cause in range(len(BUSY_CAUSES))]

        def line(first: int) -> tuple[str, str]:
            reason = fit(request, self.node(int(rows[first])), policy).shortfalls[0]
            return reason.message, reason.resource

        lines, short = _per_group(_packed(columns), line)
        return lines, _singles(short)

    # Writing a row.

    def _write(self, row: int, node: NodeState) -> None:
        gpus = node.gpus
        n = len(gpus)
        self._offers[row] = node.offers
        self._gpu_count[row] = n
        blocks, open_, free_mib, free_cores, memory, assigned, used, held, busy, gain = (
            [] for _ in range(10)
        )
        frac, whole_ok, cores_taken, slots_left, causes = [], [], [], [], []
        total = held_sum = available = busy_sum = 0
        for gpu in gpus:
            blocks.append(_block(gpu))
            open_.append(blocks[-1] == _TAKES_SHARES and gpu.shares < gpu.share_slots)
            free_mib.append(gpu.free_mib)
            free_cores.append(gpu.free_cores)
            memory.append(gpu.memory_mib)
            assigned.append(gpu.assigned_mib)
            used.append(gpu.used_mib)
            held.append(gpu.held_mib)
            busy.append(gpu.busy)
            gain.append(_whole_held(gpu) - gpu.held_mib if gpu.takes_whole() else 0)
            frac.append(free_capacity(gpu))
            whole_ok.append(gpu.takes_whole())
            cores_taken.append(gpu.assigned_cores)
            slots_left.append(gpu.share_slots - gpu.shares)
            causes.append(-1 if (cause := busy_cause(gpu)) is None else cause)
            if gpu.available:
                total += gpu.memory_mib
                held_sum += gpu.held_mib
                available += 1
                busy_sum += gpu.busy
        self._block[row] = _NO_GPU
        self._block[row, :n] = blocks
        for array, values in (
            (self._share_open, open_),
            (self._free_mib, free_mib),
            (self._free_cores, free_cores),
            (self._memory, memory),
            (self._assigned_mib, assigned),
            (self._used, used),
            (self._gpu_held, held),
            (self._gpu_busy, busy),
            (self._whole_gain, gain),
            (self._frac, frac),
            (self._whole_ok, whole_ok),
            (self._assigned_cores, cores_taken),
            (self._slots_left, slots_left),
        ):
            array[row] = 0
            array[row, :n] = values
        self._gpu_cause[row] = -1
        self._gpu_cause[row, :n] = causes
        self._total[row], self._held[row] = total, held_sum
        self._available[row], self._busy[row] = available, busy_sum
        self._product[row] = self._product_ids.setdefault(node.product, len(self._product_ids))
        host = node.host
        self._tracked[row] = host is not None
        self._free_cpu[row] = host.free_cpu_milli if host else 0
        self._free_memory[row] = host.free_memory_mib if host else 0
        free = [at for at, gpu in enumerate(gpus) if gpu.takes_whole()]
        sets = self._sets_for(node, free)
        self._sets[row] = _NO_SET
        self._sets[row, : len(sets)] = sets
        self._free_count[row] = len(free)
        nvlinked = [k for k in range(2, len(free) + 1) if sets[k, 1] != _NO_SET]
        self._largest[row] = max(nvlinked, default=min(1, len(free)))

    def _sets_for(self, node: NodeState, free: list[int]) -> npt.NDArray[np.int64]:
        """``choose_gpu_set`` of the free GPUs for every count, without and with NVLink, as
        bitmasks of GPU positions; memoised on all it reads: indices, NUMA nodes, NVLinks."""
        gpus = node.gpus
        layout = tuple(
            (g.index, g.numa_node, tuple(g.nvlinks(h.index) for h in gpus)) for g in gpus
        )
        mask = sum(1 << at for at in free)
        found = self._signatures.get((layout, mask))
        if found is not None:
            return found
        if len(self._signatures) >= MAX_SIGNATURES:
            self._signatures.clear()
        candidates = [gpus[at] for at in free]
        position = {id(gpus[at]): at for at in free}
        sets = np.full((len(free) + 1, 2), _NO_SET, dtype=np.int64)
        for count in range(1, len(free) + 1):
            for nvlink in (False, True):
                chosen = choose_gpu_set(candidates, count, nvlink)
                if chosen is not None:
                    sets[count, int(nvlink)] = sum(1 << position[id(g)] for g in chosen)
        self._signatures[(layout, mask)] = sets
        return sets

    def _alloc(self, height: int, width: int) -> None:
        """Grows the arrays to hold ``height`` rows of ``width`` GPUs, keeping what they hold.

        Rows grow by doubling, so writing node after node costs amortised O(1).
        """
        if height <= self._height and width <= self._width:
            return
        if height > self._height:
            height = max(height, 2 * self._height)
        shapes = {"node": (height,), "gpu": (height, width), "sets": (height, width + 1, 2)}
        for name, (dtype, shape, fill) in _COLUMNS.items():
            new = np.full(shapes[shape], fill, dtype=dtype)
            old = getattr(self, name, None)
            if old is not None:
                new[tuple(slice(0, n) for n in old.shape)] = old
            setattr(self, name, new)
        self._height, self._width = height, width


def _take(array: npt.NDArray[np.generic], rows: Rows) -> npt.NDArray[np.generic]:
    """``array[rows]`` GPU-major, (GPU position, row): ``np.take`` gathers several times
    faster than fancy indexing."""
    return np.ascontiguousarray(np.take(array, rows, axis=0).T)


def _block(gpu: GpuState) -> int:
    """Why the GPU takes no share whatever its free memory, as ``why_not_share`` checks."""
    if not gpu.available:
        return _UNAVAILABLE
    if gpu.mig_enabled:
        return _MIG
    if gpu.held_whole:
        return _HELD_WHOLE
    return _TAKES_SHARES


def _whole_held(gpu: GpuState) -> int:
    """The GPU's held MiB once a pod holds it whole: assigned grows by all its memory."""
    memory = gpu.memory_mib
    return memory - max(0, memory - max(gpu.assigned_mib + memory, gpu.used_mib))


def _packed(columns: list[Rows]) -> Rows:
    """Small counts (each at most ``MAX_GPUS``), one int per row: a key to group rows by."""
    key = np.zeros(len(columns[0]), dtype=np.int64)
    for column in columns:
        key = key * (MAX_GPUS + 1) + column
    return key


def _singles(resources: Objects) -> Objects:
    """Each resource as a one-element tuple, one tuple per distinct resource."""
    names = resources.tolist()
    one = {r: (r,) for r in set(names)}
    return tuple_array([one[r] for r in names])


def tuple_array(items: list[tuple[str, ...]]) -> Objects:
    """The tuples as a one-dimensional object array (never read as a 2-D table)."""
    return np.fromiter(items, dtype=object, count=len(items))


def _per_group(keys: Rows, describe: Callable[[int], tuple[str, str]]) -> tuple[Objects, Objects]:
    """(reason, resource) of each row, from ``describe(first row with its key)`` called once
    per distinct key; rows of one key share the strings."""
    if len(keys) == 0:
        return np.empty(0, dtype=object), np.empty(0, dtype=object)
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    table = np.empty((len(first), 2), dtype=object)
    for group, at in enumerate(first.tolist()):
        table[group] = describe(at)
    picked = table[inverse.reshape(-1)]
    return picked[:, 0], picked[:, 1]
