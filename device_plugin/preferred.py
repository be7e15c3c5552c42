"""GetPreferredAllocation, decided: which of the offered devices the kubelet should pick.

Whole GPUs: the set with the most NVLink links among its members, then the
most members on one NUMA node, then the lowest indices. Shares and MIG
devices: the device on the GPU that the oldest pending assignment names, so
the kubelet picks what the extender already decided.
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


def best_whole_set(available: Sequence[Device], must: Sequence[Device], size: int) -> list[Device]:
    """The best `size` devices that contain every one of `must`."""
    must_ids = {d.id for d in must}
    rest = sorted((d for d in available if d.id not in must_ids), key=lambda d: d.id)
    need = size - len(must)
    if need <= 0:
        return list(must)[:size]
    if comb(len(rest), need) <= EXHAUSTIVE_LIMIT:
        best = max(combinations(rest, need), key=lambda extra: _rank([*must, *extra]))
        return [*must, *best]
    chosen = list(must)
    for _ in range(need):
        pick = max((d for d in rest if d not in chosen), key=lambda d: _rank([*chosen, d]))
        chosen.append(pick)
    return chosen


def best_for_assignment(
    available: Sequence[Device], size: int, pending: Iterable[Pending]
) -> list[Device]:
    """Share slots or MIG devices on the GPU that the oldest matching assignment names."""
    ordered = sorted(available, key=lambda d: d.id)
    for item in pending:
        c = item.container
        wanted = {c.mig.uuid} if c.mig is not None else {g.uuid for g in c.gpus}
        kind = ordered[0].kind if ordered else None
        if c.kind != kind:
            continue
        on_target = [d for d in ordered if d.target in wanted]
        if len(on_target) >= size:
            return on_target[:size]
    return ordered[:size]
