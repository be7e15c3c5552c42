"""The ledger of what Allocate granted, and the assignments still waiting for it.

A pod's `infergrid.io/gpu-assignment` annotation (written by the extender at
bind) says which GPUs each container gets. Allocate honours an assignment at
most once per container, and never beyond what a GPU holds, whatever the
annotations say: the ledger is the plugin's own record of what it gave out.

The kubelet's Allocate names devices, not pods, and the kubelet admits pods in
its own order. So a grant that several waiting assignments could explain (same
kind, same GPUs) is provisional: it charges the largest of them, so the GPU is
never over-committed whichever pod it went to, until the kubelet's PodResources
API shows which pod holds the devices; then the ledger holds exactly that one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Final

from device_plugin.devices import Device
from device_plugin.holdings import Held
from infergrid.assignment_annotation import (
    AssignedGpu,
    AssignedMig,
    ContainerAssignment,
    PodAssignment,
)
from infergrid.inventory import Gpu, GpuInventory
from infergrid.placement import NodeState, build_node_state, idle_usage
from infergrid.records import DeviceRequest, PodRecord, is_live

_NODE: Final = "granted"
"""The name of the node the ledger builds: the gate's reasons name GPUs, never it."""
_ANY_TIME: Final = datetime(1970, 1, 1, tzinfo=UTC)
"""No clock is read: the state is built from grants alone, at one time, so never stale."""

Ref = tuple[str, str]
"""(pod uid, container name)."""


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
    def ref(self) -> Ref:
        return (self.pod.uid, self.container.name)


def explains(container: ContainerAssignment, kind: str, targets: Sequence[str]) -> bool:
    """Whether `container`'s assignment is for devices of `kind` on exactly `targets`."""
    if container.kind != kind:
        return False
    if kind == "mig":
        return container.mig is not None and [container.mig.uuid] == sorted(targets)
    return sorted(g.uuid for g in container.gpus) == sorted(targets)


def widest(containers: Sequence[ContainerAssignment]) -> ContainerAssignment:
    """The largest of containers assigned the same GPUs, GPU by GPU (memory and SMs).

    Charging it is safe whichever of them the kubelet is admitting.
    """
    first = containers[0]
    gpus = tuple(
        replace(
            g,
            memory_mib=max(x.memory_mib for c in containers for x in c.gpus if x.uuid == g.uuid),
            cores=max(x.cores for c in containers for x in c.gpus if x.uuid == g.uuid),
        )
        for g in first.gpus
    )
    return replace(first, gpus=gpus)


def as_granted(devices: Iterable[Device], name: str) -> ContainerAssignment | None:
    """The most `devices` can hold, for a holder whose assignment cannot be read.

    A share slot is charged all of its GPU, so a doubtful holder blocks more, never less.
    """
    devices = list(devices)
    if not devices:
        return None
    first = devices[0]
    if first.kind == "mig":
        return ContainerAssignment(
            name, mig=AssignedMig(first.mig_uuid or "", first.mig_profile or "", first.gpu.uuid)
        )
    gpus = {d.gpu.uuid: AssignedGpu(d.gpu.uuid, d.gpu.memory_mib, 100) for d in devices}
    return ContainerAssignment(name, gpus=tuple(gpus.values()), shared=first.kind == "share")


@dataclass(frozen=True, slots=True)
class Provisional:
    """A grant one of `candidates` holds (the plugin's guess first), the kubelet not yet asked.

    `sure` until a candidate's pod leaves: the grant may have been the leaver's,
    so the others are then charged but no longer known to include the holder.
    """

    candidates: tuple[Pending, ...]
    sure: bool = True

    @property
    def refs(self) -> set[Ref]:
        return {p.ref for p in self.candidates}


@dataclass
class Ledger:
    """Containers granted so far; the placement core counts what they hold.

    `honoured`: grants whose holder is known or the only one possible.
    `provisional`: grants the kubelet has not shown yet, by device IDs, to one of
    several candidates (the plugin's guess first). `confirmed`: holders the
    kubelet has shown. `unshown`: the devices of honoured grants it has not shown.
    """

    honoured: dict[Ref, ContainerAssignment] = field(default_factory=dict)
    provisional: dict[frozenset[str], Provisional] = field(default_factory=dict)
    confirmed: set[Ref] = field(default_factory=set)
    unshown: dict[Ref, frozenset[str]] = field(default_factory=dict)

    def copy(self) -> Ledger:
        return Ledger(
            dict(self.honoured), dict(self.provisional), set(self.confirmed), dict(self.unshown)
        )

    def charged(self) -> list[ContainerAssignment]:
        """What every grant counts for: its holder's assignment, or its largest candidate's."""
        guesses = [widest([p.container for p in e.candidates]) for e in self.provisional.values()]
        return [*self.honoured.values(), *guesses]

    def holding(self, gpus: Iterable[Gpu], share_slots: int, time_slices: int = 1) -> NodeState:
        """``gpus`` as the granted containers hold them, for the placement core to judge.

        Only grants count: measured use and health are the extender's and the
        kubelet's to weigh, and the gate must not refuse what they let through.
        The grants are read back as the extender reads recorded assignments: a
        part on a GPU outside ``gpus`` is left out, a MIG instance is found by
        its own uuid, and grants that clash are both counted, so a doubtful
        ledger offers less, never more. ``share_slots`` and ``time_slices`` are the
        plugin's own, as it publishes them for the extender.
        """
        healthy = tuple(replace(g, healthy=True) for g in gpus)
        inventory = GpuInventory(_NODE, healthy, share_slots, time_slices)
        granted = PodAssignment(_NODE, _ANY_TIME, tuple(self.charged()))
        idle = idle_usage(inventory, _ANY_TIME)
        return build_node_state(inventory, idle, (granted,), _ANY_TIME, timedelta(0))

    def guess(self, candidates: Sequence[Pending]) -> Pending:
        """The oldest candidate no other provisional grant already guessed."""
        guessed = {e.candidates[0].ref for e in self.provisional.values()}
        return next((p for p in candidates if p.ref not in guessed), candidates[0])

    def all_taken(self, candidates: Sequence[Pending]) -> bool:
        """Whether provisional grants already account for every candidate.

        Each sure one went to a different one of its own candidates, so when as
        many grants as candidates lie within the candidates, none is left.
        """
        refs = {p.ref for p in candidates}
        inside = sum(1 for e in self.provisional.values() if e.sure and e.refs <= refs)
        return inside >= len(refs)

    def honour(self, devices: Iterable[str], candidates: Sequence[Pending]) -> None:
        """Records a grant of `devices`: to its one candidate, or provisionally, guess first.

        The kubelet never gives out devices a live container holds, so an older
        provisional grant of the same devices is over and is replaced.
        """
        if len(candidates) == 1:
            self._adopt(candidates[0], frozenset(devices))
        else:
            guess = self.guess(candidates)
            rest = tuple(p for p in candidates if p.ref != guess.ref)
            self.provisional[frozenset(devices)] = Provisional((guess, *rest))
        self._settle()

    def confirm(
        self, held: Iterable[Held], pods: Iterable[PodRecord], known: dict[str, Device]
    ) -> None:
        """Adopts what the kubelet shows held as the truth about those devices and holders.

        A container the kubelet showed before and no longer lists has left it, so
        its GPUs count as free again. A grant matched to one assignment whose
        devices the kubelet shows held by another container did not go to that
        assignment: it waits again. A grant not shown yet stays as it was.
        """
        held = list(held)
        by_name = {(p.namespace, p.name): p for p in pods}
        shown: dict[Ref, ContainerAssignment] = {}
        for h in held:
            found = _holder(h, by_name.get((h.namespace, h.pod)), known)
            if found is None:
                continue
            shown[found[0]] = found[1]
            for devices in [d for d in self.provisional if d & h.devices]:
                del self.provisional[devices]
        taken = frozenset().union(*(h.devices for h in held))
        mistaken = {r for r, d in self.unshown.items() if r not in shown and d & taken}
        for ref in (self.confirmed - shown.keys()) | mistaken:
            self.honoured.pop(ref, None)
            self.unshown.pop(ref, None)
        self.honoured.update(shown)
        self.confirmed = set(shown)
        self.unshown = {r: d for r, d in self.unshown.items() if r not in shown}
        self._settle()

    def rebuild(
        self, held: Iterable[Held], pods: Iterable[PodRecord], known: dict[str, Device]
    ) -> None:
        """Starts over from what the kubelet shows held, e.g. after a plugin restart."""
        self.honoured, self.provisional, self.confirmed, self.unshown = {}, {}, set(), {}
        self.confirm(held, pods, known)

    def keep_only(self, pods: Iterable[PodRecord]) -> None:
        """Forgets containers of pods that are gone, so their GPUs count as free again.

        A holder the kubelet still lists stays whatever the API server says:
        the kubelet, not the API, knows when its devices are free.
        """
        live = {p.uid for p in pods}
        self.honoured = {
            k: v for k, v in self.honoured.items() if k[0] in live or k in self.confirmed
        }
        self.unshown = {k: v for k, v in self.unshown.items() if k in self.honoured}
        for devices, entry in list(self.provisional.items()):
            left = tuple(p for p in entry.candidates if p.pod.uid in live)
            if left != entry.candidates:
                self.provisional[devices] = Provisional(left, sure=False)
        self._settle()

    def seed(self, pods: Iterable[PodRecord]) -> None:
        """Adopts what annotations mark allocated: the fallback when the kubelet cannot say."""
        for pod in pods:
            for c in pod.assignment.containers if pod.assignment else ():
                if c.allocated:
                    self.honoured.setdefault((pod.uid, c.name), c)

    def _adopt(self, holder: Pending, devices: frozenset[str]) -> None:
        self.honoured[holder.ref] = holder.container
        self.unshown[holder.ref] = devices

    def _settle(self) -> None:
        """Drops candidates known to hold another grant; one left of a sure grant is its holder.

        With none left, the grant's holder has left: it is over.
        """
        changed = True
        while changed:
            changed = False
            for devices, entry in list(self.provisional.items()):
                left = tuple(p for p in entry.candidates if p.ref not in self.honoured)
                if entry.sure and len(left) == 1:
                    self._adopt(left[0], devices)
                    del self.provisional[devices]
                    changed = True
                elif not left:
                    del self.provisional[devices]
                    changed = True
                elif left != entry.candidates:
                    self.provisional[devices] = replace(entry, candidates=left)


def _holder(
    held: Held, pod: PodRecord | None, known: dict[str, Device]
) -> tuple[Ref, ContainerAssignment] | None:
    """Who holds `held` and what it counts for: its assignment when that explains the devices."""
    devices = [known[i] for i in sorted(held.devices) if i in known]
    if not devices:
        return None
    kind, targets = devices[0].kind, sorted({d.target for d in devices})
    if pod is None:
        uid = f"kubelet:{held.namespace}/{held.pod}"
    else:
        uid = pod.uid
        for c in pod.assignment.containers if pod.assignment else ():
            if c.name == held.container and explains(c, kind, targets):
                return (uid, c.name), c
    granted = as_granted(devices, held.container)
    return ((uid, held.container), granted) if granted else None


def pending_on(node: str, pods: Iterable[PodRecord], ledger: Ledger) -> list[Pending]:
    """Container assignments on `node` with no known holder yet, oldest assignment first."""
    found = []
    for pod in pods:
        if pod.assignment is None or pod.assignment.node != node:
            continue
        for order, c in enumerate(pod.assignment.containers):
            item = Pending(pod, c, order)
            if not c.allocated and item.ref not in ledger.honoured:
                found.append(item)
    return sorted(found, key=lambda p: p.sort_key)


@dataclass(frozen=True, slots=True)
class Unassigned:
    """A container that waits on the node for devices with no assignment there to match."""

    pod: PodRecord
    request: DeviceRequest


def unassigned_on(node: str, pods: Iterable[PodRecord], ledger: Ledger) -> list[Unassigned]:
    """Live containers bound to `node` that ask for devices no assignment for `node` names,
    and hold none the kubelet has shown: pods that reached the node past the extender.

    Allocate never grants them anything, yet the kubelet may be admitting one of them
    when it asks for the devices an assigned container was placed on.
    """
    found = []
    for pod in pods:
        if pod.node_name != node or not is_live(pod):
            continue
        held = pod.assignment if pod.assignment and pod.assignment.node == node else None
        assigned = {c.name for c in held.containers} if held else set()
        for request in pod.device_requests:
            ref = (pod.uid, request.container)
            if request.container not in assigned and ref not in ledger.honoured:
                found.append(Unassigned(pod, request))
    return found


def holder_of(held: Held | None, pods: Iterable[PodRecord]) -> Pending | None:
    """The assignment of the container the kubelet shows in `held`, if its pod has one."""
    if held is None:
        return None
    for pod in pods:
        if (pod.namespace, pod.name) != (held.namespace, held.pod) or pod.assignment is None:
            continue
        for order, c in enumerate(pod.assignment.containers):
            if c.name == held.container:
                return Pending(pod, c, order)
    return None
