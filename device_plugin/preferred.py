"""GetPreferredAllocation, decided: which of the offered devices the kubelet should pick.

First, one device on each GPU (or the MIG instance) that the oldest pending
assignment of that kind and size names, so the kubelet picks what the extender
already decided: a share slot, a MIG device, or one free time slice
(`<uuid>::<r>`) of each assigned GPU. Without such an assignment, whole GPUs
go to the set with the most NVLink links among its members, then the most
members on one NUMA node, then the lowest indices, one device per GPU.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import combinations
from math import comb

from device_plugin.devices import Device
from device_plugin.ledger import Pending
from infergrid.constants import LINK_NVLINK

EXHAUSTIVE_LIMIT = 5000
"""Above this many candidate sets, grow the set greedily instead of trying every one."""


def _links(a: Device, b: Device) -> int:
    if a.gpu.uuid == b.gpu.uuid:
        return 0
    return sum(
        link.count
        for link in a.gpu.links
        if link.peer_index == b.gpu.index and link.type == LINK_NVLINK
    )


def _rank(devices: Sequence[Device]) -> tuple[int, int, int]:
    """Bigger is better: NVLink links inside the set, NUMA locality, low indices."""
    links = sum(_links(a, b) for a, b in combinations(devices, 2))
    numa = max(Counter(d.gpu.numa_node for d in devices).values())
    return (links, numa, -sum(d.gpu.index for d in devices))


def preferred_devices(
    available: Sequence[Device], must: Sequence[Device], size: int, pending: Iterable[Pending]
) -> list[Device]:
    """The `size` devices to prefer: what an assignment names, else the best whole set, else
    the first by ID."""
    chosen = best_for_assignment(available, must, size, pending)
    if chosen is not None:
        return chosen
    if available and available[0].kind == "whole":
        return best_whole_set(available, must, size)
    return sorted(available, key=lambda d: d.id)[:size]


def best_whole_set(available: Sequence[Device], must: Sequence[Device], size: int) -> list[Device]:
    """The best `size` devices that contain every one of `must`, at most one per GPU: a time
    slice each of distinct GPUs, as a pod asking for several GPUs is promised. Too few
    GPUs offered: the first devices by ID, which Allocate then refuses with its reason."""
    held = {d.gpu.uuid for d in must}
    rest = _one_per_gpu(d for d in available if d.gpu.uuid not in held)
    need = size - len(must)
    if need <= 0:
        return list(must)[:size]
    if len(rest) < need:
        others = sorted((d for d in available if d not in must), key=lambda d: d.id)
        return [*must, *others][:size]
    if comb(len(rest), need) <= EXHAUSTIVE_LIMIT:
        best = max(combinations(rest, need), key=lambda extra: _rank([*must, *extra]))
        return [*must, *best]
    chosen = list(must)
    for _ in range(need):
        pick = max((d for d in rest if d not in chosen), key=lambda d: _rank([*chosen, d]))
        chosen.append(pick)
    return chosen


def best_for_assignment(
    available: Sequence[Device], must: Sequence[Device], size: int, pending: Iterable[Pending]
) -> list[Device] | None:
    """One device (the `must` one where given) on each GPU or MIG instance that the oldest
    assignment of this kind and size names, when all of them are offered; else None."""
    kind = available[0].kind if available else None
    first = {d.target: d for d in _one_per_gpu(available)}
    first.update({d.target: d for d in must})
    for item in pending:
        c = item.container
        wanted = {c.mig.uuid} if c.mig is not None else {g.uuid for g in c.gpus}
        fits = c.kind == kind and len(wanted) == size and wanted <= first.keys()
        if fits and all(d.target in wanted for d in must):
            return [first[t] for t in sorted(wanted)]
    return None


def _one_per_gpu(devices: Iterable[Device]) -> list[Device]:
    """The first device by ID on each GPU (or MIG instance), in ID order."""
    seen: dict[str, Device] = {}
    for d in sorted(devices, key=lambda d: d.id):
        seen.setdefault(d.target, d)
    return sorted(seen.values(), key=lambda d: d.id)
