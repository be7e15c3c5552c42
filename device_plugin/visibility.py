"""How a container is told which GPUs it may see: the device list strategy.

The NVIDIA container runtime reads the list from one of three places. With
``volume-mounts`` (the default, as NVIDIA's own device plugin does it) each GPU
is a mount the kubelet makes, ``/dev/null`` on
``/var/run/nvidia-container-devices/<uuid>``; a runtime configured with
``accept-nvidia-visible-devices-envvar-when-unprivileged = false`` and
``accept-nvidia-visible-devices-as-volume-mounts = true`` then ignores a
NVIDIA_VISIBLE_DEVICES a pod sets itself, so a pod sees only what it was granted.
``cdi`` names CDI devices (``nvidia.com/gpu=<uuid>``, as nvidia-ctk's
``--device-name-strategy=uuid`` writes them) and needs a CDI-aware runtime.
``envvar`` sets NVIDIA_VISIBLE_DEVICES=<uuids>, which trusts every pod not to set
that variable itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from infergrid.share_edits import Mount

MOUNT_DIR: Final = "/var/run/nvidia-container-devices"
"""Where the NVIDIA runtime looks for device-list mounts; also the env value that says so."""
CDI_KIND: Final = "nvidia.com/gpu"


@dataclass(frozen=True, slots=True)
class Visibility:
    """What one container is given so that it sees exactly `targets`."""

    envs: dict[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    cdi_devices: tuple[str, ...] = ()


def visibility(targets: list[str], strategy: str) -> Visibility:
    """The envs, mounts and CDI names that show a container `targets` (GPU or MIG uuids)."""
    targets = sorted(set(targets))
    if strategy == "volume-mounts":
        mounts = tuple(Mount(f"{MOUNT_DIR}/{t}", "/dev/null") for t in targets)
        return Visibility({"NVIDIA_VISIBLE_DEVICES": MOUNT_DIR}, mounts)
    if strategy == "cdi":
        return Visibility(cdi_devices=tuple(f"{CDI_KIND}={t}" for t in targets))
    if strategy == "envvar":
        return Visibility({"NVIDIA_VISIBLE_DEVICES": ",".join(targets)})
    raise ValueError(f"unknown device list strategy {strategy!r}")
