"""What a node's GPUs are and how much they are used, read through an NvmlBackend.

One bad GPU must not hide the others: a GPU whose details cannot all be read is
published unhealthy with what could be read, so the extender stops placing on it
while people still see it. A GPU whose identity (``device_info``) cannot be read
has no uuid to publish it under; it is left out and a warning is logged, and
links from other GPUs to it are dropped so the inventory stays valid. Failures
of the node-wide ``device_count`` are raised: without it nothing can be read.
Each GPU's ECC record is published as read, and the health tracker judges it.
"""

import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import TypeVar

from device_plugin.health import HealthTracker
from infergrid.constants import DEFAULT_VGPU_SLOTS_PER_GPU
from infergrid.inventory import Gpu, GpuInventory
from infergrid.nvml.backend import NvmlBackend, NvmlError
from infergrid.usage import GpuUsage, GpuUsageSample

log = logging.getLogger(__name__)

T = TypeVar("T")


def discover(
    backend: NvmlBackend,
    node: str,
    health: HealthTracker | None,
    share_slots: int = DEFAULT_VGPU_SLOTS_PER_GPU,
    time_slices: int = 1,
) -> GpuInventory:
    """The inventory of ``node``; ``health``, when given, decides and records each GPU's health.

    ``share_slots`` and ``time_slices`` are the plugin's settings, published with the
    GPUs so that the extender counts what the kubelet is offered.
    Raises NvmlError only when the GPUs cannot even be counted.
    """
    found = [_gpu(backend, index, health) for index in range(backend.device_count())]
    gpus = [gpu for gpu in found if gpu is not None]
    present = {gpu.index for gpu in gpus}
    linked = tuple(_links_within(gpu, present) for gpu in gpus)
    return GpuInventory(node, linked, share_slots, time_slices)


def sample_usage(backend: NvmlBackend, node: str, heartbeat: datetime) -> GpuUsage:
    """Memory use and utilisation of every GPU that answers; a GPU that fails is left out."""
    samples = [_sample(backend, index) for index in range(backend.device_count())]
    return GpuUsage(node, heartbeat, tuple(s for s in samples if s is not None))


def _gpu(backend: NvmlBackend, index: int, health: HealthTracker | None) -> Gpu | None:
    """GPU ``index`` as published; None, with a warning, when it cannot be identified."""
    try:
        info = backend.device_info(index)
    except NvmlError as error:
        log.warning("GPU %d left out of the inventory: %s", index, error)
        return None
    failures: list[NvmlError] = []
    mig_instances = _read(backend.mig_instances, index, (), failures)
    links = _read(backend.links, index, (), failures)
    _read(backend.memory_used_mib, index, 0, failures)  # a GPU that cannot be read is not usable
    ecc = _read(backend.ecc_state, index, None, failures)
    for error in failures:
        log.warning("GPU %d (%s) is unhealthy: %s", index, info.uuid, error)
        if health is not None:
            health.record_failure(info.uuid, str(error))
    if health is not None and ecc is not None:
        health.record_ecc(info.uuid, ecc)
    healthy = not failures and (health is None or health.is_healthy(info.uuid))
    return info.published(healthy, mig_instances, links, ecc)


def _read(read: Callable[[int], T], index: int, fallback: T, failures: list[NvmlError]) -> T:
    """``read(index)``, or ``fallback`` with the error added to ``failures``."""
    try:
        return read(index)
    except NvmlError as error:
        failures.append(error)
        return fallback


def _links_within(gpu: Gpu, present: set[int]) -> Gpu:
    """``gpu`` with only the links to GPUs that made it into the inventory."""
    kept = tuple(link for link in gpu.links if link.peer_index in present)
    return gpu if kept == gpu.links else replace(gpu, links=kept)


def _sample(backend: NvmlBackend, index: int) -> GpuUsageSample | None:
    """GPU ``index``'s sample, or None; logged at debug, as health already reports the GPU."""
    try:
        return GpuUsageSample(
            uuid=backend.device_info(index).uuid,
            used_mib=backend.memory_used_mib(index),
            utilization_percent=backend.utilization_percent(index),
        )
    except NvmlError as error:
        log.debug("GPU %d left out of the usage sample: %s", index, error)
        return None
