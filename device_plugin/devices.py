"""Which devices the kubelet sees, per resource name, from one node's inventory.

Pure: the same inventory, health and settings always give the same device
lists, and the gRPC servers only stream what this module returns.

Device IDs: a whole GPU is its UUID (`<uuid>::<r>` for time-sliced replica r),
a share slot is `<uuid>::vgpu-<k>`, a MIG device is its MIG UUID.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from device_plugin.config import PluginConfig
from infergrid.constants import RESOURCE_GPU, RESOURCE_VGPU, mig_resource
from infergrid.inventory import Gpu, GpuInventory

Kind = Literal["whole", "share", "mig"]


@dataclass(frozen=True, slots=True)
class Device:
    """One schedulable unit; `gpu` is the physical GPU it lives on."""

    id: str
    kind: Kind
    gpu: Gpu
    healthy: bool
    mig_uuid: str | None = None
    mig_profile: str | None = None

    @property
    def target(self) -> str:
        """What the container sees: the MIG device, or else the GPU."""
        return self.mig_uuid or self.gpu.uuid


def _whole(gpu: Gpu, replicas: int, healthy: bool) -> list[Device]:
    if replicas == 1:
        return [Device(gpu.uuid, "whole", gpu, healthy)]
    return [Device(f"{gpu.uuid}::{r}", "whole", gpu, healthy) for r in range(replicas)]


def _slots(gpu: Gpu, slots: int, healthy: bool) -> list[Device]:
    return [Device(f"{gpu.uuid}::vgpu-{k}", "share", gpu, healthy) for k in range(slots)]


def _migs(gpu: Gpu, healthy: bool) -> list[Device]:
    return [
        Device(m.uuid, "mig", gpu, healthy, mig_uuid=m.uuid, mig_profile=m.profile)
        for m in gpu.mig_instances
    ]


def offered_as_mig(gpu: Gpu, config: PluginConfig) -> bool:
    """Whether the GPU is offered as its MIG instances only: in MIG mode, and MIG not ignored."""
    return gpu.mig_enabled and config.mig_strategy != "none"


def resource_devices(
    inventory: GpuInventory, config: PluginConfig, is_healthy: Callable[[str], bool]
) -> dict[str, list[Device]]:
    """Resource name to its devices, under the configured MIG strategy.

    none: every GPU is whole, MIG or not. single: MIG instances are advertised
    as `nvidia.com/gpu`. mixed: each profile is its own `nvidia.com/mig-<p>`.
    GPUs in MIG mode never offer whole replicas or share slots otherwise.
    """
    out: dict[str, list[Device]] = {RESOURCE_GPU: [], RESOURCE_VGPU: []}
    for gpu in sorted(inventory.gpus, key=lambda g: g.index):
        healthy = gpu.healthy and is_healthy(gpu.uuid)
        if offered_as_mig(gpu, config):
            devices = _migs(gpu, healthy)
        else:
            devices = _whole(gpu, config.gpu_replicas, healthy)
            devices += _slots(gpu, config.vgpu_slots_per_gpu, healthy)
        for dev in devices:
            out.setdefault(resource_of(dev, config), []).append(dev)
    return out


def resource_of(device: Device, config: PluginConfig) -> str:
    """The resource name the kubelet knows ``device`` by, and a container asks for it by."""
    if device.kind == "share":
        return RESOURCE_VGPU
    if device.kind == "mig" and config.mig_strategy != "single":
        return mig_resource(device.mig_profile or "")
    return RESOURCE_GPU


def by_id(resources: dict[str, list[Device]]) -> dict[str, Device]:
    return {d.id: d for devices in resources.values() for d in devices}
