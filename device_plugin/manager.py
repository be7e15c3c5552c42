"""The device manager: what devices exist and who gets them, behind one lock.

It sits between the hardware layer (inventory, health) and the kubelet-facing
gRPC servers, which only translate its answers into protobuf. Every decision
it takes is one of the pure functions in `devices`, `allocator` and `preferred`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from device_plugin.allocator import AllocationError, Grant, grant
from device_plugin.config import PluginConfig
from device_plugin.devices import Device, by_id, resource_devices
from device_plugin.ledger import Ledger, pending_on
from device_plugin.preferred import best_for_assignment, best_whole_set
from infergrid.inventory import GpuInventory
from infergrid.records import PodRecord


class PodSource(Protocol):
    """The pods bound to this node, as fresh as the caller needs for Allocate.

    ``pods`` raises AllocationError when it cannot read them: the plugin then
    refuses rather than grant what it cannot check.
    """

    def pods(self) -> list[PodRecord]: ...


class DeviceManager:
    def __init__(
        self,
        config: PluginConfig,
        inventory: GpuInventory,
        is_healthy: Callable[[str], bool],
        pods: PodSource,
    ):
        self.config = config
        self._inventory = inventory
        self._is_healthy = is_healthy
        self._pods = pods
        self._lock = threading.Lock()
        self.ledger = Ledger()
        self._seeded = False

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
            trial = Ledger(dict(self.ledger.honoured))
            grants = [
                grant(ids, known, self.config.node_name, pods, trial, self.config)
                for ids in requests
            ]
            self.ledger = trial
            return grants

    def preferred(
        self, resource: str, available: Sequence[str], must: Sequence[str], size: int
    ) -> list[str]:
        known = by_id({resource: self.devices(resource)})
        missing = [i for i in [*available, *must] if i not in known]
        if missing:
            raise AllocationError(f"unknown device IDs: {', '.join(missing)}")
        offered = [known[i] for i in available]
        if not offered or offered[0].kind == "whole":
            chosen = best_whole_set(offered, [known[i] for i in must], size)
        else:
            with self._lock:
                ours = [
                    p for p in self._fresh_pods() if p.scheduler_name == self.config.scheduler_name
                ]
                pending = pending_on(self.config.node_name, ours, self.ledger)
            chosen = best_for_assignment(offered, size, pending)
        return [d.id for d in chosen]

    def _fresh_pods(self) -> list[PodRecord]:
        """Reads the node's pods; forgets pods that left, adopts earlier allocations once."""
        pods = self._pods.pods()
        if not self._seeded:
            self.ledger.seed(pods)
            self._seeded = True
        self.ledger.keep_only(pods)
        return pods
