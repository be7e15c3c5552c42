"""MPS, decided: which GPUs run a control daemon, where its files live, what a share holder gets.

Pure over plain data; the daemons are run by ``mps_daemon`` and watched by ``mps_health``.
One control daemon per GPU that offers shares, each started with
``CUDA_VISIBLE_DEVICES=<uuid>`` and a pipe folder of its own, so a share holder is
given only its GPU's daemon, and one daemon's death takes down one GPU's shares.
NVIDIA's device plugin runs one daemon per resource name over all its GPUs instead.

The limits are the holder's own: ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` from its
``gpu-memory`` and ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` from its ``gpu-cores``, or
``default_cores`` when it set none, so nothing on an MPS GPU runs unlimited. The
daemon's own defaults (``set_default_*`` control commands) are left alone: MPS
obeys the lower of a client's value and the daemon's, so a daemon default is a
ceiling on every share of the GPU, and shares differ in size. NVIDIA sets
card / replicas there because its replicas are all the same size.

MPS clients and their server also talk through shared memory, so every holder
mounts the folder the daemons' container has as ``/dev/shm`` (one per node, as
NVIDIA's).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from device_plugin.config import PluginConfig
from device_plugin.devices import offered_as_mig
from infergrid.inventory import Gpu, GpuInventory
from infergrid.share_edits import ALL_CORES, gpu_paths


def mps_gpus(inventory: GpuInventory, config: PluginConfig) -> tuple[Gpu, ...]:
    """The GPUs that get a control daemon: with MPS on, every GPU that offers share slots.

    That is the rule ``devices.resource_devices`` offers shares by, so no share slot is
    ever advertised on a GPU without a daemon.
    """
    if not config.mps:
        return ()
    return tuple(gpu for gpu in inventory.gpus if not offered_as_mig(gpu, config))


def daemon_env(base: Mapping[str, str], root: Path, uuid: str) -> dict[str, str]:
    """The environment of GPU ``uuid``'s control daemon: ``base``, shown only that GPU."""
    paths = gpu_paths(root, uuid)
    return {
        **base,
        "CUDA_VISIBLE_DEVICES": uuid,
        "CUDA_MPS_PIPE_DIRECTORY": str(paths.pipe),
        "CUDA_MPS_LOG_DIRECTORY": str(paths.log),
    }


def default_cores(config: PluginConfig) -> int:
    """The thread percentage of a share that asked for no ``gpu-cores``.

    Unless set, one share slot's part of the GPU: a GPU full of such shares is then
    split evenly, as NVIDIA's MPS sharing splits a GPU among its replicas. Such a share
    reserved no cores, so the scheduler may let others reserve up to 100 beside it.
    """
    if config.mps_default_cores is not None:
        return config.mps_default_cores
    return max(1, ALL_CORES // config.vgpu_slots_per_gpu)
