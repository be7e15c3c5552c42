"""GPU telemetry as Prometheus series: what NVML reads of each GPU and MIG instance, and who
holds each.

``telemetry_samples`` is pure: from the node's readings (each GPU of the inventory and its
``Telemetry``) and the GPUs' holders to every series' value. ``TelemetrySampler`` is the
thin edge: it reads the backend and the kubelet, sets the metrics, and removes the series
of a GPU, instance, process or holder that is gone, so no stale value lingers.

Device-wide values (power, temperature, clocks, links, memory) carry the GPU's labels only:
a GPU that several pods share draws one power, not one per pod. Who holds it is a series of
its own, ``infergrid_device_plugin_gpu_held_ratio{namespace,pod,container}``, the fraction
of the GPU each container holds, so a query can split any device-wide value by holder. A
process's memory names the pod of the container that holds its GPU or MIG instance alone;
on a GPU shared by several, NVML's PIDs are the host's, which the plugin's container cannot
map to pods, so those carry no pod.

A value NVML does not offer on a GPU (None in its ``Telemetry``: NVLink on a PCIe card,
utilisation in MIG mode) has no series there, and one log line per GPU says which values
are missing, once. A GPU whose reading fails counts in ``nvml_errors_total`` and has no
series until it reads again; the health monitor, not telemetry, judges it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Final

from prometheus_client import Counter
from prometheus_client.metrics import MetricWrapperBase

from device_plugin import metrics
from device_plugin.allocator import AllocationError
from device_plugin.devices import Device, by_id
from device_plugin.holdings import Held, ours
from device_plugin.manager import HeldSource, PodSource
from infergrid.assignment_annotation import PodAssignment
from infergrid.inventory import Gpu, GpuInventory
from infergrid.nvml.backend import GpuProcess, NvmlBackend, NvmlError, Telemetry
from infergrid.records import PodRecord

log = logging.getLogger(__name__)

Labels = tuple[str, ...]
PodKey = tuple[str, str]
"""(namespace, name) of a pod, as the kubelet names it."""

THROTTLE_REASONS: Final = (
    ("gpu_idle", 0x1),
    ("clocks_setting", 0x2),
    ("power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal", 0x20),
    ("hw_thermal", 0x40),
    ("hw_power_brake", 0x80),
    ("display_clocks", 0x100),
)
"""NVML's clocks-event reason bits, named as DCGM exporter's ``clock_event`` label names them."""

_GPU_VALUES: Final = (
    ("utilization_percent", metrics.GPU_UTILIZATION),
    ("memory_bandwidth_percent", metrics.GPU_MEMORY_BANDWIDTH),
    ("memory_used_mib", metrics.GPU_MEMORY_USED),
    ("power_watts", metrics.GPU_POWER),
    ("power_limit_watts", metrics.GPU_POWER_LIMIT),
    ("temperature_celsius", metrics.GPU_TEMPERATURE),
    ("sm_clock_mhz", metrics.GPU_SM_CLOCK),
    ("memory_clock_mhz", metrics.GPU_MEMORY_CLOCK),
)
_DIRECTED_VALUES: Final = (
    ("pcie_tx_bytes_per_second", metrics.GPU_PCIE_THROUGHPUT, "tx"),
    ("pcie_rx_bytes_per_second", metrics.GPU_PCIE_THROUGHPUT, "rx"),
    ("nvlink_tx_bytes", metrics.GPU_NVLINK_BYTES, "tx"),
    ("nvlink_rx_bytes", metrics.GPU_NVLINK_BYTES, "rx"),
)
TELEMETRY_METRICS: Final = (
    *(metric for _, metric in _GPU_VALUES),
    metrics.GPU_CLOCKS_THROTTLED,
    metrics.GPU_PCIE_THROUGHPUT,
    metrics.GPU_NVLINK_BYTES,
    metrics.MIG_MEMORY_USED,
    metrics.PROCESS_MEMORY_USED,
    metrics.GPU_HELD,
)
"""Every metric telemetry sets; docs/operations.md lists each beside DCGM exporter's field."""


@dataclass(frozen=True, slots=True)
class Reading:
    """One GPU of the inventory and what NVML read of it this round."""

    gpu: Gpu
    telemetry: Telemetry


@dataclass(frozen=True, slots=True)
class Holder:
    """A container holding a GPU, part of it, or one of its MIG instances (``mig_uuid``)."""

    gpu: Gpu
    mig_uuid: str
    namespace: str
    pod: str
    container: str
    ratio: float
    """The fraction of the GPU it holds."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One series' value: the metric, its label values in the metric's order, and the value."""

    metric: MetricWrapperBase
    labels: Labels
    value: float


# The pure core.


def telemetry_samples(
    node: str, readings: Iterable[Reading], holders: Sequence[Holder]
) -> list[Sample]:
    """Every series of the node's GPUs: their telemetry, their instances', processes, holders."""
    samples = []
    for reading in readings:
        samples += _gpu_samples(node, reading, holders)
    for holder in holders:
        labels = (*_gpu_labels(node, holder.gpu), holder.mig_uuid)
        held = (*labels, holder.namespace, holder.pod, holder.container)
        samples.append(Sample(metrics.GPU_HELD, held, holder.ratio))
    return samples


def _gpu_samples(node: str, reading: Reading, holders: Sequence[Holder]) -> list[Sample]:
    gpu, reads = reading.gpu, reading.telemetry
    labels = _gpu_labels(node, gpu)
    samples = [
        Sample(metric, labels, value)
        for name, metric in _GPU_VALUES
        if (value := getattr(reads, name)) is not None
    ]
    samples += [
        Sample(metric, (*labels, direction), value)
        for name, metric, direction in _DIRECTED_VALUES
        if (value := getattr(reads, name)) is not None
    ]
    if reads.throttle_reasons is not None:
        samples += [
            Sample(
                metrics.GPU_CLOCKS_THROTTLED,
                (*labels, reason),
                float(bool(reads.throttle_reasons & bit)),
            )
            for reason, bit in THROTTLE_REASONS
        ]
    samples += _process_samples(labels, gpu, "", reads.processes, holders)
    profiles = {m.uuid: m.profile for m in gpu.mig_instances}
    for mig in reads.mig:
        if mig.memory_used_mib is not None:
            mig_labels = (*labels, mig.uuid, profiles.get(mig.uuid, ""))
            samples.append(Sample(metrics.MIG_MEMORY_USED, mig_labels, mig.memory_used_mib))
        samples += _process_samples(labels, gpu, mig.uuid, mig.processes, holders)
    return samples


def _process_samples(
    labels: Labels,
    gpu: Gpu,
    mig_uuid: str,
    processes: tuple[GpuProcess, ...] | None,
    holders: Sequence[Holder],
) -> list[Sample]:
    owner = sole_holder(holders, gpu.uuid, mig_uuid)
    pod = (owner.namespace, owner.pod, owner.container) if owner else ("", "", "")
    return [
        Sample(metrics.PROCESS_MEMORY_USED, (*labels, mig_uuid, str(p.pid), *pod), p.used_mib)
        for p in processes or ()
    ]


def _gpu_labels(node: str, gpu: Gpu) -> Labels:
    return (node, gpu.uuid, gpu.model)


def sole_holder(holders: Sequence[Holder], gpu_uuid: str, mig_uuid: str = "") -> Holder | None:
    """The one container holding the GPU or MIG instance; None when none or several do.

    An instance of a GPU held whole (MIG ignored by the plugin) is its GPU's holder's.
    """
    on_gpu = [h for h in holders if h.gpu.uuid == gpu_uuid]
    found = [h for h in on_gpu if h.mig_uuid == mig_uuid]
    if not found and mig_uuid:
        found = [h for h in on_gpu if not h.mig_uuid]
    return found[0] if len(found) == 1 else None


def holders_of(
    held: Iterable[Held],
    devices: Mapping[str, Device],
    assignments: Mapping[PodKey, PodAssignment | None],
    time_slices: int,
) -> list[Holder]:
    """Who holds what, from the kubelet's listing of each container's device IDs.

    A whole GPU is held whole, or by ``1/time_slices`` per time slice; a MIG instance and a
    share by their memory's part of the GPU's, a share's as its pod's assignment gives it.
    A share whose assignment is not known yet is left out, as are devices this plugin lacks.
    """
    found = []
    for h in held:
        targets: dict[tuple[str, str], list[Device]] = {}
        for device_id in sorted(h.devices):
            if device_id in devices:
                device = devices[device_id]
                targets.setdefault((device.gpu.uuid, device.mig_uuid or ""), []).append(device)
        for (_, mig_uuid), on_target in targets.items():
            ratio = _held_ratio(h, on_target, assignments.get((h.namespace, h.pod)), time_slices)
            if ratio is not None:
                gpu = on_target[0].gpu
                found.append(Holder(gpu, mig_uuid, h.namespace, h.pod, h.container, ratio))
    return found


def held_per_gpu(holders: Iterable[Holder]) -> dict[str, float]:
    """The fraction of each GPU its holders hold together, by UUID."""
    held: dict[str, float] = {}
    for holder in holders:
        held[holder.gpu.uuid] = held.get(holder.gpu.uuid, 0.0) + holder.ratio
    return held


def holders_assigned(pods: Iterable[PodRecord], inventory: GpuInventory) -> list[Holder]:
    """Who holds what by the assignments the extender wrote, for a node with no kubelet to
    ask (a KWOK node): a whole GPU whole, a share and a MIG instance by their memory's part
    of the GPU's. GPUs and instances this node does not have are left out."""
    gpus = {gpu.uuid: gpu for gpu in inventory.gpus}
    instances = {m.uuid: (gpu, m) for gpu in inventory.gpus for m in gpu.mig_instances}
    found = []
    for pod in pods:
        if pod.assignment is None or pod.assignment.node != inventory.node:
            continue
        for c in pod.assignment.containers:
            if c.mig is not None and c.mig.uuid in instances:
                gpu, mig = instances[c.mig.uuid]
                ratio = mig.memory_mib / gpu.memory_mib
                found.append(Holder(gpu, mig.uuid, pod.namespace, pod.name, c.name, ratio))
            for part in (g for g in c.gpus if g.uuid in gpus):
                gpu = gpus[part.uuid]
                ratio = part.memory_mib / gpu.memory_mib if c.shared else 1.0
                found.append(Holder(gpu, "", pod.namespace, pod.name, c.name, ratio))
    return found


def _held_ratio(
    held: Held, devices: list[Device], assignment: PodAssignment | None, time_slices: int
) -> float | None:
    gpu, kind = devices[0].gpu, devices[0].kind
    if kind == "whole":
        return min(len(devices) / time_slices, 1.0)
    if kind == "mig":
        mib = next((m.memory_mib for m in gpu.mig_instances if m.uuid == devices[0].mig_uuid), 0)
        return mib / gpu.memory_mib
    containers = assignment.containers if assignment else ()
    parts = [
        g for c in containers if c.name == held.container for g in c.gpus if g.uuid == gpu.uuid
    ]
    return parts[0].memory_mib / gpu.memory_mib if parts else None


def unsupported(reading: Reading) -> list[str]:
    """The values NVML does not offer on the GPU, an instance's named after its uuid.

    A GPU in MIG mode has its processes read per instance, so theirs count, not its own.
    """
    reads = reading.telemetry
    gone = [f.name for f in fields(Telemetry) if getattr(reads, f.name) is None]
    if reading.gpu.mig_enabled:
        gone.remove("processes")
    for mig in reads.mig:
        values = {"memory_used_mib": mig.memory_used_mib, "processes": mig.processes}
        gone += [f"{name} of {mig.uuid}" for name, value in values.items() if value is None]
    return gone


def counter_step(previous: int | None, now: int) -> int:
    """How much a driver's byte counter grew since the last reading; 0 at the first one.

    A counter below its last reading started again (the driver reloaded): all of it is new.
    """
    if previous is None:
        return 0
    return now - previous if now >= previous else now


# The edge: reading the GPUs and the kubelet, setting the metrics.


class TelemetrySampler:
    """Reads every GPU's telemetry and the kubelet's holders each round, and sets the metrics.

    ``held`` is the kubelet's PodResources API: while it does not answer, the holders last
    known stay. ``pods`` is read only to learn a new share holder's assignment (its size), so
    a node whose holders do not change costs the API server nothing; on a node with no kubelet
    (no ``held``: a KWOK node), the pods' assignments say who holds what, read every round.
    """

    def __init__(
        self,
        backend: NvmlBackend,
        held: HeldSource | None = None,
        pods: PodSource | None = None,
        on_holders: Callable[[dict[str, float]], None] | None = None,
    ) -> None:
        """``on_holders`` hears, each round, the fraction of each GPU (by UUID) its pods
        hold: how a fake NVML runs their work (``FakeNvml.run``)."""
        self._backend = backend
        self._held = held
        self._pods = pods
        self._on_holders = on_holders
        self._holders: list[Holder] = []
        self._assignments: dict[PodKey, PodAssignment | None] = {}
        self._told_unsupported: set[tuple[str, str]] = set()
        self._failing: set[str] = set()
        self._counted: dict[tuple[MetricWrapperBase, Labels], int] = {}
        self._exported: dict[MetricWrapperBase, set[Labels]] = {m: set() for m in TELEMETRY_METRICS}

    def sample(self, inventory: GpuInventory, devices: dict[str, list[Device]]) -> None:
        """One round over the node's GPUs; ``devices`` are the plugin's, by resource name."""
        readings = [r for gpu in inventory.gpus if (r := self._read(gpu)) is not None]
        for reading in readings:
            self._tell_unsupported(reading)
        holders = self._read_holders(inventory, devices)
        if self._on_holders is not None:
            self._on_holders(held_per_gpu(holders))
        self._export(telemetry_samples(inventory.node, readings, holders))

    def _read(self, gpu: Gpu) -> Reading | None:
        try:
            reading = Reading(gpu, self._backend.telemetry(gpu.index))
        except NvmlError as err:
            metrics.NVML_ERRORS.labels(err.call).inc()
            if gpu.uuid not in self._failing:
                log.warning("GPU %s has no telemetry until it reads again: %s", gpu.uuid, err)
            self._failing.add(gpu.uuid)
            return None
        self._failing.discard(gpu.uuid)
        return reading

    def _tell_unsupported(self, reading: Reading) -> None:
        """One line per GPU for the values NVML does not offer on it that it has not told yet."""
        uuid = reading.gpu.uuid
        new = [name for name in unsupported(reading) if (uuid, name) not in self._told_unsupported]
        if new:
            self._told_unsupported.update((uuid, name) for name in new)
            log.info(
                "GPU %s (%s): NVML does not offer %s; left out of its telemetry",
                uuid,
                reading.gpu.model,
                ", ".join(new),
            )

    def _read_holders(
        self, inventory: GpuInventory, devices: dict[str, list[Device]]
    ) -> list[Holder]:
        if self._held is None:
            return self._assigned_holders(inventory)
        listing = self._held.list()
        if listing is None:
            return self._holders
        held = ours(listing, devices)
        known = by_id(devices)
        assignments = self._share_assignments(held, known)
        self._holders = holders_of(held, known, assignments, inventory.time_slices)
        return self._holders

    def _assigned_holders(self, inventory: GpuInventory) -> list[Holder]:
        if self._pods is None:
            return self._holders
        try:
            self._holders = holders_assigned(self._pods.pods(), inventory)
        except AllocationError as err:
            log.warning("gpu_held_ratio keeps the holders last known: %s", err)
        return self._holders

    def _share_assignments(
        self, held: list[Held], known: dict[str, Device]
    ) -> dict[PodKey, PodAssignment | None]:
        """The assignments of the pods holding shares, the API server asked only for new ones."""
        sharing = {
            (h.namespace, h.pod)
            for h in held
            if any(known[i].kind == "share" for i in h.devices if i in known)
        }
        self._assignments = {k: v for k, v in self._assignments.items() if k in sharing}
        missing = sharing - self._assignments.keys()
        if missing and self._pods is not None:
            try:
                pods = self._pods.pods()
            except AllocationError as err:
                log.warning("shares held on this node are left out of gpu_held_ratio: %s", err)
            else:
                listed = {(p.namespace, p.name): p.assignment for p in pods}
                self._assignments |= {k: listed[k] for k in missing if k in listed}
        return self._assignments

    def _export(self, samples: list[Sample]) -> None:
        """Sets every sample and removes the series of this plugin that none set this round."""
        now: dict[MetricWrapperBase, set[Labels]] = {m: set() for m in TELEMETRY_METRICS}
        for sample in samples:
            now[sample.metric].add(sample.labels)
            child = sample.metric.labels(*sample.labels)
            if isinstance(sample.metric, Counter):
                key = (sample.metric, sample.labels)
                child.inc(counter_step(self._counted.get(key), int(sample.value)))
                self._counted[key] = int(sample.value)
            else:
                child.set(sample.value)
        for metric, before in self._exported.items():
            for labels in before - now[metric]:
                metric.remove(*labels)
                self._counted.pop((metric, labels), None)
        self._exported = now
