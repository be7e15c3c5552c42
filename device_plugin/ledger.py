"""The ledger of what Allocate honoured, and the assignments still waiting for it.

A pod's `infergrid.io/gpu-assignment` annotation (written by the extender at
bind) says which GPUs each container gets. Allocate honours an assignment at
most once per container, and never beyond what a GPU holds, whatever the
annotations say: the ledger is the plugin's own record of what it gave out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Final

from infergrid.assignment_annotation import ContainerAssignment, PodAssignment
from infergrid.inventory import Gpu, GpuInventory
from infergrid.placement import NodeState, build_node_state, idle_usage
from infergrid.records import PodRecord

_NODE: Final = "granted"
"""The name of the node the ledger builds: the gate's reasons name GPUs, never it."""
_ANY_TIME: Final = datetime(1970, 1, 1, tzinfo=UTC)
"""No clock is read: the state is built from grants alone, at one time, so never stale."""


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


@dataclass
class Ledger:
    """Containers honoured so far; the placement core counts what they hold."""

    honoured: dict[tuple[str, str], ContainerAssignment] = field(default_factory=dict)

    def holding(self, gpus: Iterable[Gpu], share_slots: int) -> NodeState:
        """``gpus`` as the honoured containers hold them, for the placement core to judge.

        Only grants count: measured use and health are the extender's and the
        kubelet's to weigh, and the gate must not refuse what they let through.
        The grants are read back as the extender reads recorded assignments: a
        part on a GPU outside ``gpus`` is left out, a MIG instance is found by
        its own uuid, and grants that clash are both counted, so a doubtful
        ledger offers less, never more.
        """
        inventory = GpuInventory(_NODE, tuple(replace(g, healthy=True) for g in gpus), share_slots)
        granted = PodAssignment(_NODE, _ANY_TIME, tuple(self.honoured.values()))
        idle = idle_usage(inventory, _ANY_TIME)
        return build_node_state(inventory, idle, (granted,), _ANY_TIME, timedelta(0))

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
