"""Keeps the node's GPU inventory, usage heartbeat and labels current.

Every `interval_s` it re-reads the GPUs through the backend: the inventory
(health included) goes to the DeviceManager and, when it changed, to the
node annotation; the usage annotation is written every round, since its
heartbeat tells the extender this node's numbers are fresh; and the GPUs'
telemetry goes to the metrics (device_plugin/telemetry.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime

from device_plugin import metrics
from device_plugin.discovery import discover, sample_usage
from device_plugin.health import HealthTracker
from device_plugin.manager import DeviceManager, HeldSource, PodSource
from device_plugin.telemetry import TelemetrySampler
from infergrid.constants import ANNOTATION_GPU_INVENTORY, ANNOTATION_GPU_USAGE
from infergrid.inventory import encode_inventory, node_labels
from infergrid.nvml.backend import NvmlBackend, NvmlError
from infergrid.usage import encode_usage

log = logging.getLogger(__name__)

PatchNode = Callable[[dict[str, str], dict[str, str]], None]
"""(annotations, labels) -> None; writes them onto this node."""


class NodePublisher:
    def __init__(
        self,
        backend: NvmlBackend,
        tracker: HealthTracker,
        manager: DeviceManager,
        patch_node: PatchNode | None,
        interval_s: float,
        stop: threading.Event,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        held: HeldSource | None = None,
        pods: PodSource | None = None,
        on_holders: Callable[[dict[str, float]], None] | None = None,
    ):
        """`held` and `pods` tell the telemetry who holds each GPU, and it tells `on_holders`
        (see TelemetrySampler)."""
        self.backend = backend
        self.tracker = tracker
        self.manager = manager
        self.patch_node = patch_node
        self.interval_s = interval_s
        self.stop = stop
        self.clock = clock
        self._published_inventory: str | None = None
        self.telemetry = TelemetrySampler(backend, held, pods, on_holders)

    def publish_once(self) -> None:
        config = self.manager.config
        node = config.node_name
        inventory = discover(
            self.backend, node, self.tracker, config.vgpu_slots_per_gpu, config.gpu_replicas
        )
        self.manager.set_inventory(inventory)
        usage = sample_usage(self.backend, node, self.clock())
        self._export()
        self.telemetry.sample(inventory, self.manager.resources())
        if self.patch_node is None:
            return
        encoded = encode_inventory(inventory)
        annotations = {ANNOTATION_GPU_USAGE: encode_usage(usage)}
        labels = {}
        if encoded != self._published_inventory:
            annotations[ANNOTATION_GPU_INVENTORY] = encoded
            labels = node_labels(inventory)
        self.patch_node(annotations, labels)
        self._published_inventory = encoded

    def _export(self) -> None:
        for resource, devices in self.manager.resources().items():
            healthy = sum(d.healthy for d in devices)
            metrics.DEVICES.labels(resource, "healthy").set(healthy)
            metrics.DEVICES.labels(resource, "unhealthy").set(len(devices) - healthy)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.publish_once()
            except NvmlError as err:
                metrics.NVML_ERRORS.labels(err.call).inc()
                log.warning("cannot read the GPUs this round: %s", err)
            except Exception:
                metrics.PUBLISH_ERRORS.labels("node").inc()
                log.exception("publishing the node's GPU state failed; retrying next round")
            self.stop.wait(self.interval_s)
