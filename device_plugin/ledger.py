"""The ledger of what Allocate honoured, and the assignments still waiting for it.

A pod's `infergrid.io/gpu-assignment` annotation (written by the extender at
bind) says which GPUs each container gets. Allocate honours an assignment at
most once per container, and never beyond what a GPU holds, whatever the
annotations say: the ledger is the plugin's own record of what it gave out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from infergrid.assignment_annotation import ContainerAssignment
from infergrid.records import PodRecord


@dataclass(frozen=True, slots=True)
class Pending:
    """One container's assignment that Allocate has not honoured yet."""

    pod: PodRecord
    container: ContainerAssignment
    order: int

    @property
    def sort_key(self) -> tuple[datetime, str, int]:
        assert self.pod.assignment is not None
        return (self.pod.assignment.assigned_at, self.pod.key, self.order)

    @property
    def ref(self) -> tuple[str, str]:
        return (self.pod.uid, self.container.name)


@dataclass(slots=True)
class GpuLoad:
    memory_mib: int = 0
    cores: int = 0
    exclusive: bool = False
    shares: int = 0


@dataclass
class Ledger:
    """Containers honoured so far, and the load they put on each GPU."""

    honoured: dict[tuple[str, str], ContainerAssignment] = field(default_factory=dict)

    def load(self) -> dict[str, GpuLoad]:
        loads: dict[str, GpuLoad] = {}
        for c in self.honoured.values():
            for g in c.gpus:
                load = loads.setdefault(g.uuid, GpuLoad())
                load.exclusive |= not c.shared
                load.shares += c.shared
                load.memory_mib += g.memory_mib
                load.cores += g.cores
        return loads

    def honour(self, pending: Pending) -> None:
        self.honoured[pending.ref] = pending.container

    def keep_only(self, pods: Iterable[PodRecord]) -> None:
        """Forgets containers of pods that are gone, so their GPUs count as free again."""
        live = {p.uid for p in pods}
        self.honoured = {k: v for k, v in self.honoured.items() if k[0] in live}

    def seed(self, pods: Iterable[PodRecord]) -> None:
        """Adopts what annotations already mark allocated, e.g. after a plugin restart."""
        for pod in pods:
            for c in pod.assignment.containers if pod.assignment else ():
                if c.allocated:
                    self.honoured.setdefault((pod.uid, c.name), c)


def pending_on(node: str, pods: Iterable[PodRecord], ledger: Ledger) -> list[Pending]:
    """Unhonoured container assignments on `node`, oldest assignment first."""
    found = []
    for pod in pods:
        if pod.assignment is None or pod.assignment.node != node:
            continue
        for order, c in enumerate(pod.assignment.containers):
            item = Pending(pod, c, order)
            if not c.allocated and item.ref not in ledger.honoured:
                found.append(item)
    return sorted(found, key=lambda p: p.sort_key)
