"""One node's device plugin, assembled: backend, health, manager, endpoints, publisher.

`DevicePluginRuntime.start()` discovers the GPUs, tells the node's container
toolkit condition (device_plugin/toolkit.py), waits for their MPS control
daemons when MPS is on, starts the health monitor, the MPS watch, the publisher,
the pods' health reporter (when given a way to write pod conditions) and the
kubelet-facing endpoints in threads; `stop()` ends them all and removes the
sockets. Tests build it with a FakeNvml and their own pod source; the CLI builds
it from the config.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from device_plugin.config import PluginConfig
from device_plugin.confirmation import Confirmer
from device_plugin.discovery import discover
from device_plugin.endpoint import PluginEndpoint
from device_plugin.health import HealthMonitor, HealthTracker
from device_plugin.manager import DeviceManager, HeldSource, PodSource
from device_plugin.mps import mps_gpus
from device_plugin.mps_health import MpsWatch
from device_plugin.plugin import NodePlugins
from device_plugin.pod_health import PodConditions, PodHealthReporter
from device_plugin.publisher import NodePublisher, PatchNode
from device_plugin.server import DevicePluginServicer
from device_plugin.toolkit import NodeCondition, read_toolkit_condition
from infergrid.nvml.backend import NvmlBackend

log = logging.getLogger(__name__)


class DevicePluginRuntime:
    def __init__(
        self,
        config: PluginConfig,
        backend: NvmlBackend,
        pods: PodSource,
        patch_node: PatchNode | None = None,
        on_grants=None,
        tracker: HealthTracker | None = None,
        held: HeldSource | None = None,
        pod_conditions: PodConditions | None = None,
        node_condition: Callable[[NodeCondition], object] | None = None,
        on_holders: Callable[[dict[str, float]], None] | None = None,
    ):
        """`held` is the kubelet's PodResources API; without it, grants are marked at once.

        `on_holders` hears each round what fraction of each GPU its pods hold (a fake NVML
        runs their work: `FakeNvml.run`).

        `pod_conditions` writes the GPUHealthy condition of pods; without it, none is written.
        `node_condition` writes a condition of this node; without it, the toolkit's is logged.
        """
        self.config = config
        self.backend = backend
        self.stop_event = threading.Event()
        self.tracker = tracker or HealthTracker(config.health_quiet_period_s)
        inventory = discover(
            backend,
            config.node_name,
            self.tracker,
            config.vgpu_slots_per_gpu,
            config.gpu_replicas,
        )
        self.manager = DeviceManager(config, inventory, self.tracker.is_healthy, pods, held)
        on_grants = on_grants or (lambda grants: None)
        self.on_grants = Confirmer(self.manager, on_grants) if held is not None else on_grants
        self.monitor = HealthMonitor(backend, self.tracker, self.stop_event)
        self.mps = (
            MpsWatch(
                config.mps_control,
                config.mps_root,
                lambda: mps_gpus(self.manager.inventory, config),
                self.tracker,
                self.stop_event,
            )
            if config.mps
            else None
        )
        self.publisher = NodePublisher(
            backend,
            self.tracker,
            self.manager,
            patch_node,
            config.usage_interval_s,
            self.stop_event,
            held=held,
            pods=pods,
            on_holders=on_holders,
        )
        self.plugins = NodePlugins(self._endpoints, config.plugin_dir, self.stop_event)
        self.reporter = (
            None
            if pod_conditions is None
            else PodHealthReporter(
                self.tracker,
                pod_conditions,
                lambda: self.manager.inventory,
                config.usage_interval_s,
                self.stop_event,
            )
        )
        self.node_condition = node_condition
        self._threads: list[threading.Thread] = []

    def _endpoints(self) -> list[PluginEndpoint]:
        """One endpoint per resource that has devices on this node."""
        return [
            PluginEndpoint(
                resource,
                DevicePluginServicer(
                    resource,
                    self.manager,
                    self.tracker.wait_for_change,
                    self.stop_event,
                    self.on_grants,
                ),
                self.config.plugin_dir,
            )
            for resource, devices in sorted(self.manager.resources().items())
            if devices
        ]

    def start(self) -> None:
        self._tell_toolkit()
        loops = [
            ("health", self.monitor.run),
            ("publisher", self.publisher.run),
            ("kubelet", self.plugins.run),
        ]
        if self.reporter is not None:
            loops.append(("pod-health", self.reporter.run))
        if self.mps is not None:
            self.mps.wait_ready()  # before registering: offer no share its daemon does not hold
            loops.append(("mps-health", self.mps.run))
        for name, target in loops:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def _tell_toolkit(self) -> None:
        """Says, once, whether this node's container toolkit lets pods pick GPUs by env var."""
        if not self.config.toolkit_config:
            return
        condition = read_toolkit_condition(Path(self.config.toolkit_config))
        if condition.status != "True":
            log.warning("%s=%s: %s", condition.type, condition.status, condition.message)
        if self.node_condition is not None:
            self.node_condition(condition)

    def stop(self, timeout: float = 10.0) -> None:
        self.stop_event.set()
        for thread in self._threads:
            thread.join(timeout)
        self.plugins.shutdown()
        self.backend.close()
        log.info("device plugin stopped; sockets removed")
