"""The device manager: what devices exist and who gets them, behind one lock.

It sits between the hardware layer (inventory, health) and the kubelet-facing
gRPC servers, which only translate its answers into protobuf. Every decision
it takes is one of the pure functions in `devices`, `allocator`, `ledger` and
`preferred`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from device_plugin import metrics
from device_plugin.allocator import AllocationError, Grant, grant
from device_plugin.config import PluginConfig
from device_plugin.devices import Device, by_id, resource_devices
from device_plugin.holdings import Held, holding, listed, ours
from device_plugin.ledger import Ledger, Pending, holder_of, pending_on
from device_plugin.preferred import preferred_devices
from infergrid.inventory import GpuInventory
from infergrid.records import PodRecord

log = logging.getLogger(__name__)


class PodSource(Protocol):
    """The pods bound to this node, as fresh as the caller needs for Allocate.

    ``pods`` raises AllocationError when it cannot read them: the plugin then
    refuses rather than grant what it cannot check.
    """

    def pods(self) -> list[PodRecord]: ...


class HeldSource(Protocol):
    """What the kubelet shows each container holding (PodResources); None when it cannot say."""

    def list(self) -> list[Held] | None: ...

    def describe(self) -> str: ...


class DeviceManager:
    def __init__(
        self,
        config: PluginConfig,
        inventory: GpuInventory,
        is_healthy: Callable[[str], bool],
        pods: PodSource,
        held: HeldSource | None = None,
    ):
        self.config = config
        self._inventory = inventory
        self._is_healthy = is_healthy
        self._pods = pods
        self._held = held
        self._lock = threading.Lock()
        self.ledger = Ledger()
        self._seeded = False
        self._last_pods: list[PodRecord] = []
        self._listed: set[tuple[str, str]] | None = None
        """The pods the kubelet listed at the last read; None when it could not say."""
        self.fallback = ""
        """Why the ledger was seeded from marks rather than the kubelet; empty when it was not."""

    @property
    def inventory(self) -> GpuInventory:
        return self._inventory

    def set_inventory(self, inventory: GpuInventory) -> None:
        self._inventory = inventory

    def resources(self) -> dict[str, list[Device]]:
        return resource_devices(self._inventory, self.config, self._is_healthy)

    def devices(self, resource: str) -> list[Device]:
        return self.resources().get(resource, [])

    def allocate(self, resource: str, requests: Sequence[Sequence[str]]) -> list[Grant]:
        """Grants every container request of one Allocate call, or none of them."""
        known = {d.id: d for d in self.devices(resource)}
        with self._lock:
            pods = self._fresh_pods()
            trial = self.ledger.copy()
            try:
                grants = [
                    grant(ids, known, self.config.node_name, pods, trial, self.config,
                          self._listed)
                    for ids in requests
                ]  # fmt: skip
            except AllocationError as err:
                if self.fallback:
                    raise AllocationError(f"{err}; {self.fallback}") from err
                raise
            self.ledger = trial
            return grants

    def confirm(self, grants: Sequence[Grant]) -> list[Pending | None] | None:
        """The holder the kubelet shows for each grant (None: not shown yet), the ledger updated.

        None when the kubelet cannot say: the caller then keeps the plugin's guess.
        """
        held = self._held_now()
        if held is None:
            return None
        with self._lock:
            self.ledger.confirm(held, self._last_pods, by_id(self.resources()))
            return [holder_of(holding(held, g.device_ids), self._last_pods) for g in grants]

    def preferred(
        self, resource: str, available: Sequence[str], must: Sequence[str], size: int
    ) -> list[str]:
        """GetPreferredAllocation's answer for one container (see `preferred_each`)."""
        return self.preferred_each(resource, [(available, must, size)])[0]

    def preferred_each(
        self, resource: str, requests: Sequence[tuple[Sequence[str], Sequence[str], int]]
    ) -> list[list[str]]:
        """GetPreferredAllocation's answer per container (available, must include, size): the
        devices a pending assignment names, for whole GPUs too, so a time slice lands on the
        GPU the extender counted it on. The devices and the node's pods are read once per
        call, however many containers it names: per container, a call naming thousands took
        seconds, and as many reads of the pods.

        Without the node's pods it prefers by topology alone: a preference is no grant,
        and Allocate, which refuses what it cannot check, still decides.
        """
        known = by_id({resource: self.devices(resource)})
        pending: list[Pending] | None = None
        answers = []
        for available, must, size in requests:
            missing = [i for i in [*available, *must] if i not in known]
            if missing:
                raise AllocationError(f"unknown device IDs: {', '.join(missing)}")
            if pending is None:
                pending = self._pending_or_none(resource)
            offered, musts = [known[i] for i in available], [known[i] for i in must]
            answers.append([d.id for d in preferred_devices(offered, musts, size, pending)])
        return answers

    def _pending_or_none(self, resource: str) -> list[Pending]:
        try:
            return self._pending()
        except AllocationError as err:
            log.warning("preferring %s devices without the assignments: %s", resource, err)
            return []

    def _pending(self) -> list[Pending]:
        """The assignments on this node, of pods our scheduler bound, that wait for Allocate."""
        with self._lock:
            pods = self._fresh_pods()
            scheduled = [p for p in pods if p.scheduler_name == self.config.scheduler_name]
            return pending_on(self.config.node_name, scheduled, self.ledger)

    def _held_now(self) -> list[Held] | None:
        """This plugin's devices as the kubelet shows them held; None when off or unanswered."""
        return self._ours(self._listing())

    def _ours(self, listing: list[Held] | None) -> list[Held] | None:
        return None if listing is None else ours(listing, self.resources())

    def _listing(self) -> list[Held] | None:
        """Every container the kubelet lists; None when PodResources is off or unanswered."""
        return None if self._held is None else self._held.list()

    def _fresh_pods(self) -> list[PodRecord]:
        """Reads the node's pods and what the kubelet shows held; forgets pods that left.

        The first time, the ledger is rebuilt from what the kubelet shows held,
        or, when it cannot say, seeded from the marks in the pods' annotations.
        """
        pods = self._pods.pods()
        listing = self._listing()
        held = self._ours(listing)
        self._listed = None if listing is None else listed(listing)
        known = by_id(self.resources())
        if not self._seeded:
            self._start_ledger(pods, held, known)
        elif held is not None:
            self.ledger.confirm(held, pods, known)
            self.fallback = ""
        self.ledger.keep_only(pods)
        self._last_pods = pods
        return pods

    def _start_ledger(
        self, pods: list[PodRecord], held: list[Held] | None, known: dict[str, Device]
    ) -> None:
        self._seeded = True
        if held is not None:
            self.ledger.rebuild(held, pods, known)
            return
        self.ledger.seed(pods)
        if self._held is not None:
            self.fallback = f"{self._held.describe()}; the ledger was seeded from allocation marks"
            metrics.POD_RESOURCES_FALLBACKS.labels("ledger").inc()
            log.warning("%s", self.fallback)
