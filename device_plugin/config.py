"""The device plugin's settings: one versioned YAML file, overridden by flags.

Every field is checked when the config loads, so a typo or an impossible
value stops the plugin at start with the field named, never at Allocate time.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from device_plugin.kubelet import DEVICE_PLUGIN_DIR
from device_plugin.kubelet.podresources import POD_RESOURCES_SOCKET
from device_plugin.toolkit import TOOLKIT_CONFIG
from infergrid import settings
from infergrid.constants import (
    DEFAULT_VGPU_SLOTS_PER_GPU,
    MAX_TIME_SLICES_PER_GPU,
    SCHEDULER_NAME,
)
from infergrid.errors import ContractError
from infergrid.settings import (
    Setting,
    boolean,
    choice,
    load_settings,
    number,
    parse_settings,
    path,
    text,
    whole,
)

MIG_STRATEGIES: Final = ("none", "single", "mixed")
DEVICE_LIST_STRATEGIES: Final = ("volume-mounts", "cdi", "envvar")
"""How a container is told its GPUs; see device_plugin/visibility.py."""
MPS_ROOT: Final = "/run/infergrid/mps"
"""Where the MPS control daemons keep their pipes and logs, a folder per GPU (device_plugin/mps.py).

Under /run, a tmpfs on systemd hosts, so the shared memory folder beside them is in memory too.
"""
MPS_CONTROL: Final = "nvidia-cuda-mps-control"
_LONGEST_MPS_SOCKET: Final = "/GPU-00000000-0000-0000-0000-000000000000/pipe/control_privileged"
"""The longest unix socket a control daemon makes under the MPS root: its privileged control."""
MAX_MPS_ROOT_CHARS: Final = 107 - len(_LONGEST_MPS_SOCKET)
"""A unix socket's path holds at most 107 bytes; a longer root makes the daemons fail to bind."""


def _path_or_off(doc: dict, key: str) -> str:
    """A path, or "" to turn the thing off: the one setting where empty means something."""
    return "" if doc.get(key) == "" else text(doc, key)


def _mps_root(doc: dict, key: str) -> Path:
    """An absolute folder short enough that every socket the daemons make under it can bind."""
    root = path(doc, key)
    if not root.is_absolute():
        raise ContractError(key, f"must be an absolute path, got {str(root)!r}")
    if len(str(root)) > MAX_MPS_ROOT_CHARS:
        raise ContractError(
            key,
            f"is {len(str(root))} characters; at most {MAX_MPS_ROOT_CHARS} leave room for the "
            "control daemons' unix sockets under it",
        )
    return root


@dataclass(frozen=True, slots=True)
class PluginConfig:
    """What the plugin advertises and how it runs; defaults suit a GPU node."""

    node_name: str = ""
    # Only pods this scheduler bound (the one that calls the extender) get a GPU.
    scheduler_name: str = SCHEDULER_NAME
    plugin_dir: Path = Path(DEVICE_PLUGIN_DIR)
    fake_fleet: Path | None = None
    gpu_replicas: int = 1
    vgpu_slots_per_gpu: int = DEFAULT_VGPU_SLOTS_PER_GPU
    mig_strategy: str = "mixed"
    mps: bool = False
    mps_root: Path = Path(MPS_ROOT)
    mps_control: str = MPS_CONTROL
    # The thread percentage of a share that set no gpu-cores; None: 100 / vgpu_slots_per_gpu.
    mps_default_cores: int | None = None
    device_list_strategy: str = "volume-mounts"
    # The kubelet's PodResources socket; "" turns identity confirmation off.
    pod_resources_socket: str = POD_RESOURCES_SOCKET
    # The NVIDIA container toolkit's config, read at start (device_plugin/toolkit.py); "" skips it.
    toolkit_config: str = TOOLKIT_CONFIG
    health_quiet_period_s: float = 60.0
    usage_interval_s: float = 5.0
    metrics_port: int = 9400
    publish: bool = True


SETTINGS: Final = (
    Setting("nodeName", "node_name", text, "this node's name (or env NODE_NAME)", cli="--node"),
    Setting("schedulerName", "scheduler_name", text,
              "only pods this scheduler bound get GPUs (the extender's)"),
    Setting("pluginDir", "plugin_dir", path, "the kubelet's device-plugin folder"),
    Setting("fakeFleet", "fake_fleet", path, "fleet file: run on fake NVML"),
    Setting("gpuReplicas", "gpu_replicas", whole(1, MAX_TIME_SLICES_PER_GPU),
              "time slices per GPU: nvidia.com/gpu pods that may share one GPU"),
    Setting("vgpuSlotsPerGpu", "vgpu_slots_per_gpu", whole(1, 128), "share slots per GPU"),
    Setting("migStrategy", "mig_strategy", choice(MIG_STRATEGIES), "none, single or mixed"),
    Setting("mps", "mps", boolean,
              "enforce shares with MPS: one control daemon per GPU (device_plugin/mps_daemon.py)",
              boolean=True),
    Setting("mpsRoot", "mps_root", _mps_root,
              "host folder of the MPS daemons' pipes, logs and shared memory"),
    Setting("mpsControl", "mps_control", text, "the MPS control program"),
    Setting("mpsDefaultCores", "mps_default_cores", whole(1, 100),
              "thread percentage of a share without gpu-cores (default 100 / vgpuSlotsPerGpu)"),
    Setting("deviceListStrategy", "device_list_strategy", choice(DEVICE_LIST_STRATEGIES),
              "volume-mounts, cdi or envvar: how a container is given its GPUs"),
    Setting("podResourcesSocket", "pod_resources_socket", _path_or_off,
              "the kubelet's PodResources socket; empty turns it off"),
    Setting("containerToolkitConfig", "toolkit_config", _path_or_off,
              "the NVIDIA toolkit's config.toml, told as a node condition; empty: none"),
    Setting("healthQuietPeriodSeconds", "health_quiet_period_s", number(0, 86400),
              "a GPU recovers after this long without a fault"),
    Setting("usageIntervalSeconds", "usage_interval_s", number(0.1, 10),
              "seconds between usage heartbeats"),
    Setting("metricsPort", "metrics_port", whole(0, 65535), "0 turns /metrics off"),
    Setting("publish", "publish", boolean,
              "write node annotations and pods' GPUHealthy conditions", boolean=True),
)  # fmt: skip


def parse_config(doc: object) -> dict:
    """The fields a config document sets, checked; absent ones keep their defaults."""
    return parse_settings(doc, SETTINGS)


def add_flags(parser: argparse.ArgumentParser) -> None:
    settings.add_flags(parser, SETTINGS)


def load_config(args: argparse.Namespace, env_node: str | None = None) -> PluginConfig:
    """File, then flags, each checked by the same reader."""
    config = load_settings(PluginConfig(), SETTINGS, args, node_name=env_node)
    if not config.node_name:
        raise ContractError("nodeName", "is required (flag --node or env NODE_NAME)")
    return config
