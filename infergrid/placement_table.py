"""Who holds what on every GPU: the per-GPU table behind `infergrid placements` and the demo.

Built from the same annotations the extender reads (inventory, usage, assignments) and
through the placement core's own NodeState, so the free memory it prints is exactly
what the extender would offer the next pod.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from infergrid.assignment_annotation import PodAssignment
from infergrid.inventory import GpuInventory
from infergrid.placement import build_node_state
from infergrid.placement.state import GpuState
from infergrid.usage import GpuUsage

COLUMNS = (
    "NODE", "GPU", "MODEL", "POD", "HOLDS", "MIB", "CORES%", "FREE_MIB", "TOTAL_MIB", "NOTE"
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Holder:
    """One pod container's part of one GPU."""

    pod: str  # namespace/name
    kind: str  # whole, time-slice, share or mig:<profile>
    memory_mib: int
    cores: int


@dataclass(frozen=True, slots=True)
class GpuRow:
    node: str
    index: int
    model: str
    total_mib: int
    free_mib: int  # what the extender would offer: 0 on a GPU that offers nothing
    holders: tuple[Holder, ...]
    note: str = ""  # why a GPU offers nothing


def gpu_rows(
    inventories: Iterable[GpuInventory],
    usages: Mapping[str, GpuUsage],
    assignments: Mapping[str, PodAssignment],
    now: datetime,
    stale_after: timedelta,
) -> list[GpuRow]:
    """One row per GPU, nodes by name; ``assignments`` is keyed by "namespace/name"."""
    by_node: dict[str, list[tuple[str, PodAssignment]]] = {}
    for pod, assignment in assignments.items():
        by_node.setdefault(assignment.node, []).append((pod, assignment))
    rows = []
    for inv in sorted(inventories, key=lambda i: i.node):
        held = by_node.get(inv.node, [])
        state = build_node_state(inv, usages.get(inv.node), [a for _, a in held], now, stale_after)
        mig_mib = {m.uuid: m.memory_mib for g in inv.gpus for m in g.mig_instances}
        for gpu in state.gpus:
            holders = tuple(_holders(gpu, held, mig_mib))
            free = _free_mib(gpu) if gpu.available else 0
            note = "" if gpu.available else "unhealthy" if not gpu.healthy else "no fresh usage"
            rows.append(GpuRow(inv.node, gpu.index, gpu.model, gpu.memory_mib, free, holders, note))
    return rows


def _free_mib(gpu: GpuState) -> int:
    """A MIG GPU offers its untaken instances, not the memory between them."""
    if gpu.mig_enabled:
        return sum(slot.memory_mib for slot in gpu.mig if not slot.taken)
    return gpu.free_mib


def _holders(
    state: GpuState, held: list[tuple[str, PodAssignment]], mig_mib: Mapping[str, int]
) -> Iterator[Holder]:
    """The pods on the GPU; a whole-GPU holder of a time-sliced GPU shows as a time slice."""
    whole = "time-slice" if state.time_sliced else "whole"
    for pod, assignment in sorted(held, key=lambda h: h[0]):
        for container in assignment.containers:
            mig = container.mig
            if mig is not None and mig.gpu_uuid == state.uuid:
                yield Holder(pod, f"mig:{mig.profile}", mig_mib.get(mig.uuid, 0), 0)
            kind = whole if container.kind == "whole" else container.kind
            for gpu in container.gpus:
                if gpu.uuid == state.uuid:
                    yield Holder(pod, kind, gpu.memory_mib, gpu.cores)


def render(rows: list[GpuRow]) -> str:
    """A fixed-width table: a GPU's first line carries its free memory, one line per holder."""
    lines: list[tuple[str, ...]] = [COLUMNS]
    for row in rows:
        first = (row.node, str(row.index), row.model)
        tail = (str(row.free_mib), str(row.total_mib), row.note)
        if not row.holders:
            lines.append((*first, "-", "-", "-", "-", *tail))
        for n, h in enumerate(row.holders):
            lead = first if n == 0 else ("", "", "")
            end = tail if n == 0 else ("", "", "")
            mib = str(h.memory_mib) if h.memory_mib else "-"
            lines.append((*lead, h.pod, h.kind, mib, str(h.cores) if h.cores else "-", *end))
    widths = [max(len(line[i]) for line in lines) for i in range(len(COLUMNS))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )
