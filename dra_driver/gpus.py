"""This node's GPUs as the driver publishes them, read through the NVML seam.

One GPU that cannot be read must not hide the others: a GPU without an identity is left
out, one whose MIG instances cannot be read is kept unhealthy (published with no devices),
one whose links cannot be read is kept without links (a clique of its own). Only a failure
to count the GPUs raises, since then nothing is known.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import replace

from dra_driver.slices import NodeDevice, node_devices
from infergrid.inventory import Gpu
from infergrid.nvml.backend import NvmlBackend, NvmlError

log = logging.getLogger(__name__)


def read_gpus(backend: NvmlBackend) -> tuple[Gpu, ...]:
    found = [_gpu(backend, index) for index in range(backend.device_count())]
    gpus = [gpu for gpu in found if gpu is not None]
    present = {gpu.index for gpu in gpus}
    return tuple(
        replace(gpu, links=tuple(link for link in gpu.links if link.peer_index in present))
        for gpu in gpus
    )


def _gpu(backend: NvmlBackend, index: int) -> Gpu | None:
    try:
        info = backend.device_info(index)
    except NvmlError as err:
        log.warning("GPU %d is not published: %s", index, err)
        return None
    healthy, instances, links = True, (), ()
    try:
        instances = backend.mig_instances(index) if info.mig_enabled else ()
    except NvmlError as err:
        log.warning("GPU %d (%s) offers nothing: its MIG instances: %s", index, info.uuid, err)
        healthy = False
    try:
        links = backend.links(index)
    except NvmlError as err:
        log.warning("GPU %d (%s) is published without links: %s", index, info.uuid, err)
    return info.published(healthy, instances, links)


class NodeGpus:
    """The last reading of the node's GPUs, shared by the publisher (which reads) and the
    prepare step (which maps a claim's device names to what was published)."""

    def __init__(self, backend: NvmlBackend) -> None:
        self.backend = backend
        self._lock = threading.Lock()
        self._gpus: tuple[Gpu, ...] = ()
        self._devices: dict[str, NodeDevice] = {}

    def read(self) -> tuple[Gpu, ...]:
        gpus = read_gpus(self.backend)
        with self._lock:
            self._gpus, self._devices = gpus, node_devices(gpus)
        return gpus

    def devices(self) -> Mapping[str, NodeDevice]:
        with self._lock:
            return self._devices
